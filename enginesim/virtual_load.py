"""Closed-loop load on an in-process engine running on a virtual clock: the timing model without HTTP.

Minutes of simulated traffic take a second or two of CPU, and the figures are the model's own, free of the
host's scheduling noise. Benchmarks (``bench/sim_max_num_seqs.py``) and tests use it to show how
``--max-num-seqs`` trades throughput and inter-token latency against queueing and preemption.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from enginesim.clock import VirtualClock
from enginesim.engine import Engine, Failed, Finished, Token
from enginesim.loadgen import percentile
from enginesim.metrics import EngineMetrics
from enginesim.profiles import SpeedProfile
from enginesim.scheduler import Scheduler


@dataclass(frozen=True)
class VirtualLoadResult:
    """What clients and the engine saw over one run (seconds are virtual)."""

    max_num_seqs: int
    requests_done: int
    tokens_per_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    queue_time_mean: float
    preemptions: int
    kv_blocks: int
    # The GPU's utilisation over the run, as the simulated GPU file reports it (``Engine.load_seconds``).
    gpu_utilization: float = 0.0
    # ITL p99 per reading window (``reading_seconds``, in order from the run's start), as an agent scraping
    # every ``reading_seconds`` reports it (None: no token in that window): a prefill that stalls every running
    # sequence once can leave the p99 over the whole run low while it breaches the windows it falls in.
    itl_p99_readings: tuple[float | None, ...] = ()
    reading_seconds: float = 1.0

    def itl_breach_share(self, threshold: float, since: float = 0.0) -> float:
        """The share of the known readings from ``since`` on with ITL p99 above ``threshold`` (how the
        ``itl-slo`` policy reads a condition with ``min_share``)."""
        first = math.ceil(since / self.reading_seconds)
        known = [v for v in self.itl_p99_readings[first:] if v is not None]
        return sum(1 for v in known if v > threshold) / len(known) if known else 0.0


def run_virtual_load(profile: SpeedProfile, *, max_num_seqs: int, concurrency: int, prompt_tokens: int,
                     output_tokens: int, duration: float, gpu_memory_utilization: float = 0.9,
                     block_size: int = 16, max_num_batched_tokens: int = 8192,
                     reading_seconds: float = 1.0) -> VirtualLoadResult:
    """Keep ``concurrency`` requests in flight for ``duration`` virtual seconds; measure as a client would."""
    return asyncio.run(_run(profile, max_num_seqs, concurrency, prompt_tokens, output_tokens, duration,
                            gpu_memory_utilization, block_size, max_num_batched_tokens, reading_seconds))


async def _run(profile: SpeedProfile, max_num_seqs: int, concurrency: int, prompt_tokens: int,
               output_tokens: int, duration: float, gpu_memory_utilization: float, block_size: int,
               max_num_batched_tokens: int, reading_seconds: float) -> VirtualLoadResult:
    clock = VirtualClock()
    registry = CollectorRegistry()
    blocks = profile.kv_capacity_blocks(gpu_memory_utilization, block_size)
    metrics = EngineMetrics(registry, model_name="virtual", max_model_len=profile.max_model_len, cache_info={})
    scheduler = Scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          total_blocks=blocks, block_size=block_size)
    engine = Engine(profile=profile, scheduler=scheduler, metrics=metrics, clock=clock, prefix_caching=False)
    engine.steps = profile.warmup_steps  # measure the warm engine
    ttfts: list[float] = []
    itls: list[float] = []
    windows: list[list[float]] = [[] for _ in range(max(1, math.ceil(duration / reading_seconds)))]
    done = 0
    tokens = 0

    async def client() -> None:
        nonlocal done, tokens
        while clock.now() < duration:
            handle = engine.submit(prompt_tokens=prompt_tokens, max_tokens=output_tokens, ignore_eos=True)
            start, last = clock.now(), None
            while True:
                event = await handle.events.get()
                if isinstance(event, Token):
                    now = clock.now()
                    if now > duration:
                        continue  # past the window: not counted
                    tokens += 1
                    if last is None:
                        ttfts.append(now - start)
                    else:
                        itls.append(now - last)
                        windows[min(int(now // reading_seconds), len(windows) - 1)].append(now - last)
                    last = now
                elif isinstance(event, Finished | Failed):
                    break
            if clock.now() <= duration:
                done += 1

    runner = asyncio.create_task(engine.run())
    await asyncio.gather(*(client() for _ in range(concurrency)))
    engine.stop()
    await runner
    queue_sum = registry.get_sample_value("vllm:request_queue_time_seconds_sum",
                                          {"model_name": "virtual", "engine": "0"}) or 0.0
    queue_count = registry.get_sample_value("vllm:request_queue_time_seconds_count",
                                            {"model_name": "virtual", "engine": "0"}) or 1.0
    preemptions = registry.get_sample_value("vllm:num_preemptions_total",
                                            {"model_name": "virtual", "engine": "0"}) or 0.0
    return VirtualLoadResult(
        max_num_seqs=max_num_seqs, requests_done=done, tokens_per_s=tokens / duration,
        ttft_p50=percentile(ttfts, 50) or 0.0, ttft_p99=percentile(ttfts, 99) or 0.0,
        itl_p50=percentile(itls, 50) or 0.0, itl_p99=percentile(itls, 99) or 0.0,
        queue_time_mean=queue_sum / max(queue_count, 1.0), preemptions=int(preemptions), kv_blocks=blocks,
        gpu_utilization=min(1.0, engine.load_seconds / max(clock.now(), duration)),
        itl_p99_readings=tuple(percentile(w, 99) for w in windows), reading_seconds=reading_seconds,
    )
