"""SGLang as users run it (``python -m sglang.launch_server``): the names and facts of the simulator's SGLang face.

``pitstop sim serve --engine sglang`` takes SGLang's flags and answers as an SGLang 0.5.23 server does, as far as
Pitstop and its users can see. Everything here was read from SGLang 0.5.23's own source, and the metric families
were captured from its own collectors (``tests/fixtures/sglang-0.5.23/``, whose README lists the facts):

- ``/metrics`` exists only with ``--enable-metrics``. Request-level families (tokens, requests, TTFT, inter-token
  latency, end-to-end latency) come from the tokenizer manager and carry ``model_name`` and ``engine_type``;
  scheduler families (running, queued, token usage, retractions, queue time) carry the rank labels too, one set of
  series per data-parallel rank, and only tensor-parallel rank 0 reports them.
- ``/health`` and ``/health_generate`` both queue a one-token generation on an idle server (a busy scheduler's
  own output answers them) and wait, polling once a second for up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20)
  seconds, for any output of the scheduler: 503 while it starts, when nothing came (the server is then marked
  unhealthy) and from SIGTERM on.
- SIGTERM drains with no timeout: in-flight requests finish (new ones are still taken), then the process exits 0;
  if the last health check had failed it exits at once.
- The scheduler's watchdog kills the whole server (SIGKILL, after 5 s) when a batch makes no progress for
  ``--watchdog-timeout`` (300) seconds; a dead scheduler takes the server down the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

VERSION = "0.5.23"
DEFAULT_PORT = 30000
DEFAULT_WATCHDOG_TIMEOUT_S = 300.0
# The scheduler's watchdog waits this long after it fires, so the server can log why, before it kills the server.
WATCHDOG_KILL_DELAY_S = 5.0
HEALTH_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
DEFAULT_HEALTH_TIMEOUT_S = 20
HEALTH_POLL_S = 1.0  # /health sleeps this long before each look for scheduler output
KEEP_ALIVE_ENV = "SGLANG_TIMEOUT_KEEP_ALIVE"
# The scheduler publishes its gauges after each prefill batch and every this many decode steps.
DECODE_LOG_INTERVAL = 40
DEFAULT_PAGE_SIZE = 1
DEFAULT_CHUNKED_PREFILL_SIZE = 8192  # what SGLang picks on an 80 GB card
WARMUP_MAX_NEW_TOKENS = 8
WARMUP_PROMPT_TOKENS = 4
ENGINE_TYPE = "unified"  # no prefill/decode disaggregation

# Default histogram bounds (TokenizerMetricsCollector; --bucket-* replaces the first three).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               600.0, 1200.0, 1800.0, 2400.0)
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
                 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
                 300000, 400000, 600000, 800000, 1000000, 1100000)
QUEUE_TIME_BUCKETS = (0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50,
                      60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800,
                      2000, 2500, 3000)


@dataclass(frozen=True)
class SglangOptions:
    """What SGLang's flags decide beyond what every personality shares (``server.ServeConfig``)."""

    enable_metrics: bool = False
    dp_size: int = 1
    watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT_S
    ttft_buckets: tuple[float, ...] = TTFT_BUCKETS
    itl_buckets: tuple[float, ...] = ITL_BUCKETS
    e2e_buckets: tuple[float, ...] = E2E_BUCKETS
    skip_warmup: bool = False
    log_level: str = "info"
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT_S


def add_flags(parser: argparse.ArgumentParser) -> None:
    """SGLang's launch flags the simulator models (the rest are accepted and ignored with a warning)."""
    g = parser.add_argument_group("sglang flags (with --engine sglang)")
    g.add_argument("--model-path", "--model", dest="model_path", help="model weights path or repo id")
    g.add_argument("--served-model-name", default=None, help="the one name clients use (default: --model-path)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=DEFAULT_PORT)
    g.add_argument("--max-running-requests", type=int, default=None,
                   help="requests one scheduler runs at once (default: sized from the KV cache, 2048 to 4096)")
    g.add_argument("--enable-metrics", action="store_true", help="serve /metrics (404 without it)")
    g.add_argument("--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int, default=1)
    g.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1,
                   help="data-parallel schedulers, each its own batch and KV cache, requests sent round robin")
    g.add_argument("--bucket-time-to-first-token", nargs="+", type=float, default=None, metavar="SECONDS")
    g.add_argument("--bucket-inter-token-latency", nargs="+", type=float, default=None, metavar="SECONDS")
    g.add_argument("--bucket-e2e-request-latency", nargs="+", type=float, default=None, metavar="SECONDS")
    g.add_argument("--watchdog-timeout", type=float, default=DEFAULT_WATCHDOG_TIMEOUT_S,
                   help="a batch without progress this long kills the server (default 300 s)")
    g.add_argument("--log-level", default="info", help="accepted; the simulator's log does not change")
    g.add_argument("--context-length", type=int, default=None, help="default: the profile's")
    g.add_argument("--chunked-prefill-size", type=int, default=DEFAULT_CHUNKED_PREFILL_SIZE)
    g.add_argument("--mem-fraction-static", type=float, default=0.9)
    g.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    g.add_argument("--disable-radix-cache", action="store_true")
    g.add_argument("--disable-custom-all-reduce", action="store_true")
    g.add_argument("--skip-server-warmup", action="store_true")


def options(args: argparse.Namespace, env: Mapping[str, str]) -> SglangOptions:
    """The SGLang-only options of parsed ``add_flags`` arguments; ValueError on values SGLang refuses."""
    if args.dp_size < 1:
        raise ValueError(f"--dp-size must be at least 1, got {args.dp_size}")
    if args.watchdog_timeout <= 0:
        raise ValueError(f"--watchdog-timeout must be a positive number of seconds, got {args.watchdog_timeout:g}")
    return SglangOptions(
        enable_metrics=args.enable_metrics, dp_size=args.dp_size, watchdog_timeout=args.watchdog_timeout,
        ttft_buckets=_buckets(args.bucket_time_to_first_token, TTFT_BUCKETS),
        itl_buckets=_buckets(args.bucket_inter_token_latency, ITL_BUCKETS),
        e2e_buckets=_buckets(args.bucket_e2e_request_latency, E2E_BUCKETS),
        skip_warmup=args.skip_server_warmup, log_level=args.log_level,
        health_timeout=_whole_seconds(env, HEALTH_TIMEOUT_ENV, DEFAULT_HEALTH_TIMEOUT_S))


def shared_settings(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """``ServeConfig`` fields from SGLang's flags (the running limit is settled once the KV cache is sized)."""
    model = args.model_path or args.model
    return {
        "model": model, "host": args.host, "port": args.port,
        "served_model_names": [args.served_model_name] if args.served_model_name else [],
        "max_num_batched_tokens": args.chunked_prefill_size, "max_model_len": args.context_length,
        "gpu_memory_utilization": args.mem_fraction_static, "block_size": args.page_size,
        "enable_prefix_caching": not args.disable_radix_cache, "tensor_parallel_size": args.tp_size,
        "disable_custom_all_reduce": args.disable_custom_all_reduce,
        "keep_alive": _whole_seconds(env, KEEP_ALIVE_ENV, 5),
    }


def max_running_requests(requested: int | None, kv_tokens: int, context_len: int) -> int:
    """The running limit of one scheduler, as SGLang sizes it from its KV pool.

    Asked for: that many, but never more than half the pool's tokens. Not asked for: 512 per context length of
    pool tokens, kept within 2048..4096, and never more than half the pool's tokens either.
    """
    cap = max(1, kv_tokens // 2)
    if requested is not None:
        return max(1, min(requested, cap))
    estimated = max(min(int(kv_tokens / context_len * 512), 4096), 2048)
    return max(1, min(estimated, cap))


def _buckets(given: list[float] | None, default: tuple[float, ...]) -> tuple[float, ...]:
    return default if not given else tuple(given)


def _whole_seconds(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: not a whole number of seconds") from None
