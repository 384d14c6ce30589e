"""One simulated SGLang server's life once its model is loaded: ranks, warm-up, signals, watchdog, death.

As ``python -m sglang.launch_server`` behaves (``enginesim/sglang.py`` lists the facts):

- Listening is not ready: the server sends itself one warm-up request (8 tokens) and /health answers 503 until it
  finished ("The server is fired up and ready to roll!"); ``--skip-server-warmup`` skips it.
- SIGTERM drains with no timeout: /health turns 503, requests keep being taken and served, and the process exits
  0 once none is in flight, or at once if the last health check had failed. SIGINT stops at once (exit 0).
- A scheduler that dies (the crash fault, a CUDA out-of-memory) or whose batch makes no progress for
  ``--watchdog-timeout`` seconds (the hang fault with work queued; after a further 5 s) takes the whole server
  down by SIGKILL: ``serve`` returns ``-SIGKILL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from typing import TextIO

import uvicorn
from prometheus_client import CollectorRegistry

from enginesim.api import DropBrokenStreams, ServingContext
from enginesim.clock import Clock, RealClock
from enginesim.dp import DataParallel
from enginesim.engine import Engine, Failed, Finished, Token
from enginesim.faults import all_reduce_penalty_seconds
from enginesim.gpufile import SimulatedGpu
from enginesim.scheduler import Scheduler
from enginesim.server import (
    GpuPublisher,
    Personality,
    ServeConfig,
    UvicornServer,
    log,
    run_engine,
    start_faults,
    wait_listening,
)
from enginesim.sglang import VERSION, WARMUP_MAX_NEW_TOKENS, WARMUP_PROMPT_TOKENS, WATCHDOG_KILL_DELAY_S, SglangOptions
from enginesim.sglang_api import ServerStatus, SglangState, create_app
from enginesim.sglang_metrics import SglangMetrics

DIE = -signal.SIGKILL  # how SGLang's server ends when a scheduler is lost: it kills its process tree, itself too
DRAIN_POLL_S = 5.0  # SGLang looks at what is left to drain every 5 s
SUBPROCESS_WATCH_S = 1.0  # SGLang notices a dead scheduler process within a second


def _options(config: ServeConfig) -> SglangOptions:
    assert config.sglang is not None, "an SGLang face needs SGLang options"
    return config.sglang


def kv_tokens(config: ServeConfig) -> int:
    """Tokens of one scheduler's KV pool."""
    return config.profile.kv_capacity_blocks(config.gpu_memory_utilization, config.block_size) * config.block_size


def build_engine(config: ServeConfig, registry: CollectorRegistry,
                 clock: Clock | None = None) -> tuple[SglangMetrics, DataParallel]:
    """SGLang's families on ``registry`` and one engine per data-parallel rank, on the real clock unless given one."""
    options = _options(config)
    clock = RealClock() if clock is None else clock
    metrics = SglangMetrics(registry, model_name=config.names[0], options=options,
                            tp_size=config.tensor_parallel_size)
    overhead = all_reduce_penalty_seconds(config.faults, tensor_parallel_size=config.tensor_parallel_size,
                                          custom_all_reduce=not config.disable_custom_all_reduce)
    blocks = config.profile.kv_capacity_blocks(config.gpu_memory_utilization, config.block_size)
    engines = []
    for rank in range(options.dp_size):
        scheduler = Scheduler(max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                              total_blocks=blocks, block_size=config.block_size)
        sink = metrics.rank(dp_rank=rank if options.dp_size > 1 else None, scheduler=scheduler, clock=clock,
                            context_len=config.model_len)
        engines.append(Engine(profile=config.profile, scheduler=scheduler, metrics=sink, clock=clock,
                              prefix_caching=config.enable_prefix_caching, seed=config.seed + rank,
                              step_overhead_s=overhead))
    return metrics, DataParallel(engines)


def _start_lines(config: ServeConfig) -> list[str]:
    options = _options(config)
    return [f"SGLang {VERSION} server (simulated, profile {config.profile.name}): model_path={config.model}, "
            f"tp_size={config.tensor_parallel_size}, dp_size={options.dp_size}, "
            f"enable_metrics={options.enable_metrics}",
            f"Load weight begin ({config.startup_seconds:.1f}s)"]


async def _warmup(engine: DataParallel, state: SglangState, out: TextIO) -> None:
    """The request SGLang sends itself once listening; the server is Up when it finished."""
    if not state.options.skip_warmup:
        if state.options.enable_metrics:  # it goes through the server's own HTTP API
            for endpoint, method in (("/model_info", "GET"), ("/generate", "POST")):
                state.metrics.http_started(endpoint, method)
                state.metrics.http_ended(endpoint, method, 200)
        handle = engine.submit(prompt_tokens=WARMUP_PROMPT_TOKENS, max_tokens=WARMUP_MAX_NEW_TOKENS,
                               ignore_eos=True)
        while not isinstance(event := await handle.events.get(), Finished):
            if isinstance(event, Failed):
                return  # the engine died: its watcher ends the server
            assert isinstance(event, Token)
            handle.first_token_sent(engine.clock.now())
    state.status = ServerStatus.UP
    log(out, "The server is fired up and ready to roll!")


async def _watchdog(engine: Engine, stuck_after: float) -> None:
    """Return once the engine's batch has made no progress for ``stuck_after`` seconds (SGLang's scheduler watchdog:
    looked at every ``stuck_after / 2`` seconds, only while there is a batch)."""
    steps, since = engine.steps, engine.clock.now()
    while True:
        await asyncio.sleep(stuck_after / 2)
        now = engine.clock.now()
        if engine.steps != steps or not engine.has_work():
            steps, since = engine.steps, now
        elif now - since > stuck_after:
            return


async def run_serving(config: ServeConfig, gpus: list[SimulatedGpu], publisher: GpuPublisher,
                      tasks: list[asyncio.Task[None]], out: TextIO) -> int:
    options = _options(config)
    registry = CollectorRegistry()
    metrics, engine = build_engine(config, registry)
    publisher.engine = engine
    log(out, f"Load weight end. KV cache per rank: {kv_tokens(config)} tokens; "
             f"max_running_requests={config.max_num_seqs}, chunked_prefill_size={config.max_num_batched_tokens}, "
             f"context_len={config.model_len}, page_size={config.block_size}")
    state = SglangState(options=options, metrics=metrics, out=out)
    ctx = ServingContext(engine=engine, model=config.model, served_names=config.names,
                         max_model_len=config.model_len, registry=registry, error_rate=config.faults.error_rate,
                         rng=random.Random(config.seed + 1))
    uconfig = uvicorn.Config(DropBrokenStreams(create_app(ctx, state)), host=config.host, port=config.port,
                             log_level="warning", access_log=False, lifespan="off",
                             timeout_graceful_shutdown=1, timeout_keep_alive=config.keep_alive)
    server = UvicornServer(uconfig)
    ending: list[int] = []  # the exit code, once decided

    def end(code: int) -> None:
        if not ending:
            ending.append(code)
        server.should_exit = True

    async def drain() -> None:
        while engine.in_flight and state.status is not ServerStatus.UNHEALTHY:
            log(out, f"Draining: {engine.in_flight} requests in flight")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(engine.wait_idle(), DRAIN_POLL_S)
        if engine.in_flight:
            log(out, f"The last health check failed: exiting with {engine.in_flight} requests in flight")
        await asyncio.sleep(0.1)  # let the last responses flush
        engine.stop("server shutting down")
        end(0)

    def on_sigterm() -> None:
        if not state.shutting_down:
            state.shutting_down = True
            log(out, "SIGTERM received: draining the requests in flight, then shutting down (no timeout)")
            tasks.append(asyncio.create_task(drain()))

    def on_sigint() -> None:
        engine.stop("server shutting down")
        end(0)

    def lose_the_server(reason: str) -> None:
        print(f"ERROR: {reason}", file=out, flush=True)
        log(out, "SIGQUIT received: a scheduler failed; killing the server's process tree")
        end(DIE)

    async def watch_death() -> None:
        await engine.died.wait()
        print(f"ERROR: {engine.death_message}", file=out, flush=True)
        await asyncio.sleep(SUBPROCESS_WATCH_S)
        lose_the_server("Scheduler process died.")

    async def watch_progress(rank: Engine) -> None:
        await _watchdog(rank, options.watchdog_timeout)
        print(f"ERROR: Scheduler watchdog timeout (watchdog_timeout={options.watchdog_timeout:g}, soft=False)",
              file=out, flush=True)
        await asyncio.sleep(WATCHDOG_KILL_DELAY_S)
        lose_the_server("The scheduler's batch made no progress.")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    serving = asyncio.create_task(server.serve())
    await wait_listening(server, serving)
    if serving.done():
        await serving
        return 1
    log(out, f"Uvicorn running on http://{config.host}:{config.port}")
    tasks.append(asyncio.create_task(run_engine(engine)))
    tasks.append(asyncio.create_task(watch_death()))
    tasks.extend(asyncio.create_task(watch_progress(rank)) for rank in engine.engines)
    tasks.append(asyncio.create_task(_warmup(engine, state, out)))
    start_faults(config.faults, engine, gpus, tasks, out, crash_message="Scheduler died (injected fault: crash)")
    await serving
    engine.stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    return ending[0] if ending else 0


PERSONALITY = Personality(_start_lines, "ERROR: Rank 0 scheduler is dead (injected fault: fail-start).", run_serving)
