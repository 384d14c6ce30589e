"""One simulated vLLM server process: cold start, HTTP serving, GPU files, faults and signal handling.

``serve(config)`` is the process's whole life and returns its exit code: 0 after SIGTERM/SIGINT, 1 when the
engine dies (crash fault, CUDA OOM) or start-up fails; a negative code -N means the process is to die by signal
N (the SGLang face, ``sglang_server``, dies by SIGKILL as SGLang does). SIGTERM follows ``vllm serve``: with
``--shutdown-timeout 0`` in-flight requests are aborted at once (streams end broken); with N > 0 new requests
get 500 while in-flight ones finish, for at most N seconds, and /health stays 200 meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

import uvicorn
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from enginesim.api import VLLM_VERSION, DropBrokenStreams, ServingContext, create_app
from enginesim.clock import Clock, RealClock
from enginesim.dp import DataParallel
from enginesim.engine import Engine, EngineState
from enginesim.faults import MIB, FaultConfig, RssLeak, all_reduce_penalty_seconds, fault_delay, read_clock_file
from enginesim.gpufile import SimulatedGpu, remove_readings, write_reading
from enginesim.metrics import EngineMetrics
from enginesim.profiles import SpeedProfile
from enginesim.scheduler import Scheduler
from enginesim.sglang import SglangOptions

GPU_FILE_INTERVAL_S = 1.0
LEAK_INTERVAL_S = 1.0


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``pitstop sim serve`` was told."""

    model: str
    profile: SpeedProfile
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: list[str] = field(default_factory=list)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    disable_custom_all_reduce: bool = False
    shutdown_timeout: float = 0.0
    startup_seconds: float = 3.0
    seed: int = 0
    gpu_dir: Path = Path(".pitstop/simgpu")
    gpu_indices: list[int] = field(default_factory=lambda: [0])
    faults: FaultConfig = field(default_factory=FaultConfig)
    # Seconds an idle client connection stays open: vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE (uvicorn's 5 by default).
    keep_alive: int = 5
    # ``--scheduler-cls``: a dotted name on the engine's PYTHONPATH, as vLLM takes it (None: its own scheduler).
    scheduler_cls: str | None = None
    # ``--engine sglang``: what SGLang's flags decide beyond the fields above (None: the vLLM face).
    sglang: SglangOptions | None = None

    @property
    def names(self) -> list[str]:
        return self.served_model_names or [self.model]

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.profile.max_model_len


class UvicornServer(uvicorn.Server):
    """uvicorn without its own signal handlers: this process decides what SIGTERM means."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def log(out: TextIO, message: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [enginesim] {message}", file=out, flush=True)


def build_engine(config: ServeConfig, registry: CollectorRegistry, clock: Clock | None = None) -> Engine:
    """Engine, scheduler and metrics for ``config``, on the real clock unless given another."""
    blocks = config.profile.kv_capacity_blocks(config.gpu_memory_utilization, config.block_size)
    cache_info = {"block_size": str(config.block_size), "num_gpu_blocks": str(blocks),
                  "gpu_memory_utilization": str(config.gpu_memory_utilization),
                  "enable_prefix_caching": str(config.enable_prefix_caching), "cache_dtype": "auto"}
    metrics = EngineMetrics(registry, model_name=config.names[0], max_model_len=config.model_len,
                            cache_info=cache_info)
    # vLLM serves prometheus_client's default registry, which carries the process_* and python_* families.
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    scheduler = Scheduler(max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                          total_blocks=blocks, block_size=config.block_size)
    if config.scheduler_cls is not None:
        scheduler.cap = live_cap(config.scheduler_cls, config.max_num_seqs)
    overhead = all_reduce_penalty_seconds(config.faults, tensor_parallel_size=config.tensor_parallel_size,
                                          custom_all_reduce=not config.disable_custom_all_reduce)
    return Engine(profile=config.profile, scheduler=scheduler, metrics=metrics,
                  clock=RealClock() if clock is None else clock, prefix_caching=config.enable_prefix_caching,
                  seed=config.seed, step_overhead_s=overhead)


def live_cap(scheduler_cls: str, startup_limit: int) -> Callable[[], int]:
    """The live cap of a ``--scheduler-cls`` plug-in, read at each step: its module is imported by name from the
    engine's PYTHONPATH as vLLM imports it (an import that fails stops the engine, as it stops vLLM), and its
    cap file (``CapFile``, named in its ``ENV_FILE`` variable) is what the simulated scheduler obeys. A class the
    simulator cannot drive (no ``CapFile`` and ``about``) leaves the startup limit."""
    module_name, _, _ = scheduler_cls.rpartition(".")
    module: Any = importlib.import_module(module_name)
    if not (hasattr(module, "CapFile") and hasattr(module, "about")):
        return lambda: startup_limit
    cap_file = module.CapFile(os.environ.get(module.ENV_FILE), startup_limit,
                              about=module.about(VLLM_VERSION, "enginesim.scheduler.Scheduler"))
    return cast(Callable[[], int], cap_file.current)


async def _every(interval: float, action: Callable[[], None]) -> None:
    while True:
        action()
        await asyncio.sleep(interval)


CLOCK_FILE_POLL_S = 0.5


async def _fault_clock(faults: FaultConfig, listening_at: float) -> float:
    """The unix time timed faults count from: the clock file's (waited for), else when this server listened."""
    if faults.clock_file is None:
        return listening_at
    # Another process writes the file: there is nothing to wait on but the file system.
    while (moment := read_clock_file(faults.clock_file)) is None:  # noqa: ASYNC110
        await asyncio.sleep(CLOCK_FILE_POLL_S)
    return moment


async def _timed_faults(faults: FaultConfig, actions: dict[str, Callable[[], None]], out: TextIO) -> None:
    """Fire each timed fault (``actions`` by FaultConfig field name) at its moment on the fault clock."""
    listening_at = time.time()
    clock = await _fault_clock(faults, listening_at)
    now = time.time()
    due = sorted((delay, name) for name in actions
                 if (delay := fault_delay(name, getattr(faults, name), clock=clock, listening_at=listening_at,
                                          now=now)) is not None)
    for _, name in due:
        await asyncio.sleep(max(0.0, clock + float(getattr(faults, name)) - time.time()))
        log(out, f"injected fault: {name.removesuffix('_after').replace('_', ' ')}")
        actions[name]()


class GpuPublisher:
    """Advances the simulated GPUs from engine activity and writes their files."""

    def __init__(self, config: ServeConfig, gpus: list[SimulatedGpu], engine: Engine | DataParallel | None) -> None:
        self.config, self.gpus, self.engine = config, gpus, engine
        self._last = time.monotonic()
        self._load = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        dt, self._last = now - self._last, now
        load = self.engine.load_seconds if self.engine else 0.0
        util = (load - self._load) / dt if dt > 0 else 0.0
        self._load = load
        for gpu in self.gpus:
            gpu.advance(dt, util)
            write_reading(self.config.gpu_dir, gpu.reading(time.time()))


Serving = Callable[[ServeConfig, list[SimulatedGpu], "GpuPublisher", list[asyncio.Task[None]], TextIO],
                   Awaitable[int]]


@dataclass(frozen=True)
class Personality:
    """What differs between the engines the simulator can pass for: how it announces itself, how it fails to
    start, and how it serves once loaded (``run``: from listening to the exit code)."""

    start_lines: Callable[[ServeConfig], list[str]]
    fail_start_line: str
    run: Serving


def _vllm_start_lines(config: ServeConfig) -> list[str]:
    return [f"vLLM API server version 0.33.0 (simulated, profile {config.profile.name})",
            f"Loading model {config.model} ({config.startup_seconds:.1f}s)"]


def personality(config: ServeConfig) -> Personality:
    """vLLM's face, or SGLang's with ``--engine sglang``."""
    if config.sglang is None:
        return Personality(_vllm_start_lines, "ERROR: EngineCore failed to start (injected fault: fail-start).",
                           _run_serving)
    from enginesim import sglang_server  # it builds on this module

    return sglang_server.PERSONALITY


async def serve(config: ServeConfig, *, out: TextIO = sys.stderr) -> int:
    """Run one simulated server until a signal or the engine's death; returns the exit code."""
    faults = config.faults
    face = personality(config)
    gpus = [SimulatedGpu(profile=config.profile, index=i, pid=os.getpid(),
                         memory_utilization=config.gpu_memory_utilization) for i in config.gpu_indices]
    publisher = GpuPublisher(config, gpus, None)
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(_every(GPU_FILE_INTERVAL_S, publisher.tick))]
    try:
        for line in face.start_lines(config):
            log(out, line)
        if faults.fail_start:
            await asyncio.sleep(min(config.startup_seconds, 1.0))
            print(face.fail_start_line, file=out, flush=True)
            return 1
        await asyncio.sleep(config.startup_seconds)
        return await face.run(config, gpus, publisher, tasks, out)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        remove_readings(config.gpu_dir, gpus)


async def _run_serving(config: ServeConfig, gpus: list[SimulatedGpu], publisher: GpuPublisher,
                       tasks: list[asyncio.Task[None]], out: TextIO) -> int:
    faults = config.faults
    registry = CollectorRegistry()
    engine = build_engine(config, registry)
    publisher.engine = engine
    log(out, f"KV cache: {engine.scheduler.total_blocks} blocks of {config.block_size} tokens "
             f"({engine.scheduler.total_blocks * config.block_size} tokens); max_num_seqs={config.max_num_seqs}")
    all_reduce = "NCCL" if config.disable_custom_all_reduce else "custom"
    log(out, f"tensor_parallel_size={config.tensor_parallel_size}, all-reduce: {all_reduce}"
             + (f" (+{engine.step_overhead_s * 1000:g} ms per step: slow all-reduce fault)"
                if engine.step_overhead_s else ""))
    ctx = ServingContext(engine=engine, model=config.model, served_names=config.names,
                         max_model_len=config.model_len, registry=registry, error_rate=faults.error_rate,
                         rng=random.Random(config.seed + 1))
    uconfig = uvicorn.Config(DropBrokenStreams(create_app(ctx)), host=config.host, port=config.port,
                             log_level="warning", access_log=False, lifespan="off",
                             timeout_graceful_shutdown=1, timeout_keep_alive=config.keep_alive)
    server = UvicornServer(uconfig)
    exit_code = 0
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            return
        stop.set()
        if config.shutdown_timeout > 0:
            ctx.draining = True
            tasks.append(asyncio.create_task(_drain(engine, config.shutdown_timeout, server, out)))
        else:
            log(out, "Shutting down: aborting in-flight requests (shutdown-timeout 0)")
            engine.stop("server shutting down")
            server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    async def watch_death() -> None:
        await engine.died.wait()
        print(f"ERROR: {engine.death_message}", file=out, flush=True)
        await asyncio.sleep(0.3)  # let the failed requests' answers go out, as vLLM's API server does
        server.should_exit = True

    serving = asyncio.create_task(server.serve())
    await wait_listening(server, serving)
    if serving.done():
        await serving
        return 1
    log(out, f"Application startup complete; serving on http://{config.host}:{config.port}")
    tasks.append(asyncio.create_task(run_engine(engine)))
    tasks.append(asyncio.create_task(watch_death()))
    start_faults(faults, engine, gpus, tasks, out, crash_message="EngineCore died (injected fault: crash)")
    await serving
    if engine.state is EngineState.DEAD:
        exit_code = 1
    else:
        engine.stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    return exit_code


def start_faults(faults: FaultConfig, engine: Engine | DataParallel, gpus: list[SimulatedGpu],
                 tasks: list[asyncio.Task[None]], out: TextIO, *, crash_message: str) -> None:
    """Start the timed faults (and the leaks) against a serving engine and its GPUs."""
    leak = RssLeak()
    leaking = asyncio.Event()
    if faults.leak_after is None:
        leaking.set()

    async def leak_loop() -> None:
        await leaking.wait()
        await _every(LEAK_INTERVAL_S, leak_tick)

    def leak_tick() -> None:
        leak.grow(faults.leak_rss_mb_per_min * LEAK_INTERVAL_S / 60.0)
        for gpu in gpus:
            gpu.leak(int(faults.leak_gpu_mb_per_min * LEAK_INTERVAL_S / 60.0 * MIB))

    def xid() -> None:
        at = time.time()
        for gpu in gpus:
            gpu.add_xids(faults.xid_codes, at)
        for code in faults.xid_codes:
            print(f"NVRM: Xid (PCI:0000:00:00): {code}, simulated", file=out, flush=True)

    def hot() -> None:
        for gpu in gpus:
            gpu.hot = True

    def surge() -> None:
        engine.step_overhead_per_seq_s = faults.latency_surge_ms_per_seq / 1000.0

    timed: dict[str, Callable[[], None]] = {
        "hang_after": lambda: engine.hang(faults.hang_gauges), "crash_after": lambda: engine.kill(crash_message),
        "xid_after": xid, "hot_gpu_after": hot, "latency_surge_after": surge, "leak_after": leaking.set}
    tasks.append(asyncio.create_task(_timed_faults(faults, timed, out)))
    if faults.leak_rss_mb_per_min > 0 or faults.leak_gpu_mb_per_min > 0:
        tasks.append(asyncio.create_task(leak_loop()))


async def run_engine(engine: Engine | DataParallel) -> None:
    """The engine loop; a bug in it kills the engine (requests fail, exit 1) instead of hanging silently."""
    try:
        await engine.run()
    except Exception as exc:
        engine.kill(f"EngineCore failed: {exc!r}")
        raise


async def wait_listening(server: uvicorn.Server, serving: asyncio.Task[None]) -> None:
    # uvicorn exposes readiness only as a flag, so poll it briefly.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.02)


async def _drain(engine: Engine, grace: float, server: uvicorn.Server, out: TextIO) -> None:
    log(out, f"Draining {engine.in_flight} in-flight requests (shutdown-timeout {grace:g}s)")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(engine.wait_idle(), grace)
    await asyncio.sleep(0.1)  # let the last responses flush
    engine.stop("server shutting down")
    server.should_exit = True


def configure_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
