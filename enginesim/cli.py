"""``pitstop sim``: ``serve MODEL [vllm serve flags]`` runs a simulated vLLM 0.33 server, ``load URL...`` drives one.

``serve`` takes the ``vllm serve`` flags Pitstop manages, simulator flags (``--sim-*``) and fault flags
(``--fault-*``, also ``PITSTOP_SIM_FAULT_*`` env vars). Any other vLLM flag (``--foo``, ``--foo value``,
``--foo=value``) is accepted and ignored with one warning line on stderr, so an engine command line written
for real vLLM starts the simulator unchanged. ``serve --engine sglang`` takes SGLang's launch flags instead
(``enginesim/sglang.py``), its unknown flags ignored the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path

from enginesim import sglang
from enginesim.faults import HANG_GAUGES, FaultConfig, resolve_faults
from enginesim.gpufile import gpu_indices
from enginesim.loadgen import LoadSpec, run_load
from enginesim.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from enginesim.server import ServeConfig, configure_logging, serve
from enginesim.sglang_server import kv_tokens

DEFAULT_GPU_DIR = ".pitstop/simgpu"
ENGINES = ("vllm", "sglang")


def _engine_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pitstop sim serve", add_help=False, allow_abbrev=False)
    p.add_argument("--engine", choices=ENGINES, default="vllm",
                   help="the engine to pass for: vllm (default) or sglang (then SGLang's flags apply)")
    return p


def _serve_parser(engine: str = "vllm") -> argparse.ArgumentParser:
    title = "SGLang 0.5.23" if engine == "sglang" else "vLLM 0.33"
    p = argparse.ArgumentParser(prog="pitstop sim serve", description=f"Serve a simulated {title} engine.",
                                allow_abbrev=False, parents=[_engine_parser()])
    p.add_argument("model", nargs="?", help="model name or path (as for vllm serve)" if engine == "vllm" else
                   "model name or path (SGLang's own flag is --model-path)")
    if engine == "sglang":
        sglang.add_flags(p)
    else:
        p.add_argument("--model", dest="model_flag", help=argparse.SUPPRESS)
        _add_vllm_flags(p)
    _add_sim_flags(p)
    return p


def _add_vllm_flags(p: argparse.ArgumentParser) -> None:
    v = p.add_argument_group("vllm serve flags")
    v.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; vLLM's is 0.0.0.0)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--served-model-name", nargs="+", default=None, help="names clients may use")
    v.add_argument("--max-num-seqs", type=int, default=256)
    v.add_argument("--scheduler-cls", default=None,
                   help="a scheduler plug-in by dotted name on PYTHONPATH, as vLLM takes it (its live cap is obeyed)")
    v.add_argument("--max-num-batched-tokens", type=int, default=8192)
    v.add_argument("--max-model-len", type=int, default=None, help="default: the profile's")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    v.add_argument("--block-size", type=int, default=16)
    v.add_argument("--enforce-eager", action="store_true", help="accepted; no effect on timing")
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
                   help="GPUs one engine spans; > 1 all-reduces every step (only the slow all-reduce fault "
                        "makes that cost anything)")
    v.add_argument("--disable-custom-all-reduce", action="store_true",
                   help="all-reduce with NCCL instead of vLLM's custom kernel: no cost from the slow all-reduce "
                        "fault")
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    v.add_argument("--shutdown-timeout", type=float, default=0.0,
                   help="on SIGTERM, seconds to let in-flight requests finish (0: abort them)")


def _add_sim_flags(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("simulator flags")
    s.add_argument("--sim-profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    s.add_argument("--sim-startup-seconds", type=float, default=3.0,
                   help="model-loading delay before the port listens")
    s.add_argument("--sim-seed", type=int, default=0)
    s.add_argument("--sim-gpu-dir", default=None,
                   help=f"GPU reading files (env PITSTOP_SIM_GPU_DIR, default {DEFAULT_GPU_DIR})")
    f = p.add_argument_group("fault injection (each also PITSTOP_SIM_FAULT_<NAME>; the flag wins)")
    f.add_argument("--fault-leak-rss-mb-per-min", type=float, default=None, help="host RSS grows (real memory)")
    f.add_argument("--fault-leak-gpu-mb-per-min", type=float, default=None, help="simulated GPU memory grows")
    f.add_argument("--fault-hang-after", type=float, default=None, metavar="SECONDS",
                   help="seconds until the engine wedges (vllm#39863): /health and /metrics keep answering 200, "
                        "requests are accepted and never answered (streams get their 200 headers only), no "
                        "token is generated and no vllm:* series moves any more (for running/waiting see "
                        "--fault-hang-gauges)")
    f.add_argument("--fault-hang-gauges", choices=HANG_GAUGES, default=None,
                   help="what vllm:num_requests_running/waiting (and waiting_by_reason) read while hung: 'zero' "
                        "(default; vLLM 0.32 with its EngineCore frozen) or 'last', the values at the hang; "
                        "KV cache usage keeps its value either way")
    f.add_argument("--fault-crash-after", type=float, default=None, help="seconds until the engine dies")
    f.add_argument("--fault-fail-start", action="store_true", default=None, help="exit 1 during start-up")
    f.add_argument("--fault-error-rate", type=float, default=None, help="fraction of requests answered 500")
    f.add_argument("--fault-xid-after", type=float, default=None, help="seconds until a simulated XID event")
    f.add_argument("--fault-xid-code", default=None, metavar="CODE[,CODE...]",
                   help="XID code (default 13); several, comma-separated, are logged at the same instant")
    f.add_argument("--fault-hot-gpu-after", type=float, default=None,
                   help="seconds until the GPU heats past its slowdown temperature")
    f.add_argument("--fault-slow-all-reduce-ms", type=float, default=None, metavar="MS",
                   help="every engine step takes MS ms longer while the engine runs tensor parallel with the "
                        "custom all-reduce (a PCIe host without NVLink); --disable-custom-all-reduce removes it")
    f.add_argument("--fault-leak-after", type=float, default=None, metavar="SECONDS",
                   help="the leaks (--fault-leak-*-mb-per-min) start this many seconds in (default: at start)")
    f.add_argument("--fault-latency-surge-after", type=float, default=None, metavar="SECONDS",
                   help="seconds until a latency surge: every engine step costs --fault-latency-surge-ms-per-seq "
                        "more per sequence in its batch (long-context traffic), so ITL grows with the batch and a "
                        "lower --max-num-seqs brings it down")
    f.add_argument("--fault-latency-surge-ms-per-seq", type=float, default=None, metavar="MS",
                   help="the surge's extra step cost per sequence in the batch (default 8 ms)")
    f.add_argument("--fault-clock-file", default=None, metavar="PATH",
                   help="timed faults count from the unix time in PATH (waiting until it exists) instead of from "
                        "when this server listens; a hang, crash, XID or timed leak whose moment passed before "
                        "this server listened never fires here, a hot GPU or latency surge holds from the start")


def split_unknown(extras: list[str]) -> tuple[list[str], list[str]]:
    """Split argparse's leftovers into ignored ``--flags`` (with their values) and stray positionals."""
    flags: list[str] = []
    strays: list[str] = []
    previous_flag = False
    for item in extras:
        if item.startswith("-"):
            flags.append(item.split("=", 1)[0])
            previous_flag = "=" not in item
        elif previous_flag:
            previous_flag = False  # the value of the flag before it
        else:
            strays.append(item)
    return flags, strays


def serve_config(argv: list[str], env: Mapping[str, str]) -> tuple[ServeConfig, list[str]]:
    """Parse ``serve`` arguments; returns the config and the ignored engine flags. SystemExit on bad input."""
    engine = _engine_parser().parse_known_args(argv)[0].engine
    parser = _serve_parser(engine)
    args, extras = parser.parse_known_args(argv)
    ignored, strays = split_unknown(extras)
    model = (args.model_path or args.model) if engine == "sglang" else (args.model or args.model_flag)
    if strays or not model:
        parser.error(f"unexpected arguments: {' '.join(strays)}" if strays else "the model is required")
    if engine == "sglang":
        return _sglang_config(args, parser, env), ignored
    if args.tensor_parallel_size < 1:
        parser.error(f"--tensor-parallel-size must be at least 1, got {args.tensor_parallel_size}")
    faults = _faults(args, parser, env)
    config = ServeConfig(
        model=model, profile=get_profile(args.sim_profile), host=args.host, port=args.port,
        served_model_names=args.served_model_name or [], max_num_seqs=args.max_num_seqs,
        scheduler_cls=args.scheduler_cls,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching, shutdown_timeout=args.shutdown_timeout,
        tensor_parallel_size=args.tensor_parallel_size, disable_custom_all_reduce=args.disable_custom_all_reduce,
        startup_seconds=args.sim_startup_seconds, seed=args.sim_seed,
        gpu_dir=Path(args.sim_gpu_dir or env.get("PITSTOP_SIM_GPU_DIR") or DEFAULT_GPU_DIR),
        gpu_indices=gpu_indices(env.get("CUDA_VISIBLE_DEVICES")), faults=faults,
        keep_alive=keep_alive_seconds(env.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE"), parser),
    )
    return config, ignored


def _faults(args: argparse.Namespace, parser: argparse.ArgumentParser, env: Mapping[str, str]) -> FaultConfig:
    fault_flags = {f.name: getattr(args, "fault_" + f.name) for f in fields(FaultConfig)}
    try:
        return resolve_faults(fault_flags, env)
    except ValueError as exc:
        parser.error(str(exc))


def _sglang_config(args: argparse.Namespace, parser: argparse.ArgumentParser, env: Mapping[str, str]) -> ServeConfig:
    """``serve --engine sglang``: SGLang's flags onto the shared config, the running limit sized as SGLang does."""
    if args.tp_size < 1:
        parser.error(f"--tp-size must be at least 1, got {args.tp_size}")
    try:
        options = sglang.options(args, env)
        shared = sglang.shared_settings(args, env)
    except ValueError as exc:
        parser.error(str(exc))
    config = ServeConfig(
        profile=get_profile(args.sim_profile), sglang=options, faults=_faults(args, parser, env),
        startup_seconds=args.sim_startup_seconds, seed=args.sim_seed,
        gpu_dir=Path(args.sim_gpu_dir or env.get("PITSTOP_SIM_GPU_DIR") or DEFAULT_GPU_DIR),
        gpu_indices=gpu_indices(env.get("CUDA_VISIBLE_DEVICES")), **shared)
    limit = sglang.max_running_requests(args.max_running_requests, kv_tokens(config), config.model_len)
    return replace(config, max_num_seqs=limit)


def keep_alive_seconds(value: str | None, parser: argparse.ArgumentParser) -> int:
    """``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` as vLLM reads it: whole seconds, 5 when unset."""
    if value is None:
        return 5
    try:
        return int(value)
    except ValueError:
        parser.error(f"VLLM_HTTP_TIMEOUT_KEEP_ALIVE={value!r}: not a whole number of seconds")


def _load_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pitstop sim load",
                                description="Streaming chat load against vLLM-compatible servers; prints JSON.")
    p.add_argument("urls", nargs="+", help="base URLs, e.g. http://127.0.0.1:8000 (round robin)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--duration", type=float, default=10.0, help="seconds; 0 runs until Ctrl-C")
    p.add_argument("--rate", type=float, default=None, help="requests per second (default: closed loop)")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--model", default=None, help="default: the first model the first URL lists")
    p.add_argument("--max-requests", type=int, default=None)
    return p


async def _load_main(spec: LoadSpec) -> dict[str, object]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    return await run_load(spec, stop=stop)


def main(argv: list[str]) -> int:
    """Entry point of ``pitstop sim``."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: pitstop sim {serve,load} ...\n\n"
              "  serve MODEL [vllm serve flags]  run a simulated vLLM 0.33 server\n"
              "  serve --engine sglang --model-path MODEL [sglang flags]\n"
              "                                 run a simulated SGLang 0.5.23 server\n"
              "  load URL [URL ...]             streaming load generator with a JSON summary")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        config, ignored = serve_config(rest, os.environ)
        if ignored:
            engine = "SGLang" if config.sglang is not None else "vLLM"
            print(f"WARNING: ignoring {engine} flags the simulator does not model: {', '.join(ignored)}",
                  file=sys.stderr, flush=True)
        configure_logging()
        code = asyncio.run(serve(config))
        if code < 0:  # the server dies by that signal, as SGLang's does when it loses a scheduler
            sys.stderr.flush()
            os.kill(os.getpid(), -code)
        return code
    if command == "load":
        a = _load_parser().parse_args(rest)
        spec = LoadSpec(urls=a.urls, concurrency=a.concurrency, duration=a.duration, rate=a.rate,
                        prompt_tokens=a.prompt_tokens, max_tokens=a.max_tokens, model=a.model,
                        max_requests=a.max_requests)
        print(json.dumps(asyncio.run(_load_main(spec)), indent=2))
        return 0
    print(f"pitstop sim: unknown command {command!r} (choose from serve, load)", file=sys.stderr)
    return 2
