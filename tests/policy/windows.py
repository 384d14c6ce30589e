"""Scrape windows as an agent reports them (``agent.wire.EngineWindow`` in a sample), built from drawn latencies
binned into vLLM's own bucket bounds."""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from controlplane.policy.signals import ReplicaSample, from_stored

# vLLM's bounds (0.32/0.33): inter-token latency and time to first token.
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
              40.0, 80.0)
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
SCRAPE = timedelta(seconds=5)


def histogram(draws: Sequence[float], bounds: Sequence[float]) -> dict[str, list[float]]:
    counts = [0.0] * (len(bounds) + 1)
    for x in draws:
        counts[bisect.bisect_left(bounds, x)] += 1
    return {"bounds": list(bounds), "counts": counts}


def engine_steps(rng: random.Random, steps: int, batch: int, median: float, spread: float = 0.3) -> list[float]:
    """Inter-token latencies of ``steps`` engine steps of ``batch`` running requests: vLLM stamps every
    request's token of one step at the same moment, so each step's latency is observed ``batch`` times."""
    return [x for _ in range(steps) for x in [median * rng.lognormvariate(0, spread)] * batch]


def window(ended_at: datetime, itl: Sequence[float], *, steps: float | None, ttft: Sequence[float] = (),
           tps: float = 100.0, seconds: float = SCRAPE.total_seconds(),
           itl_bounds: Sequence[float] = ITL_BOUNDS) -> ReplicaSample:
    """The sample reported at the window's end: its histograms, its step count and the generation rate, stored as
    the store keeps them and read back as the rollout reads them."""
    w: dict[str, Any] = {"ended_at": ended_at.isoformat(), "seconds": seconds, "itl": histogram(itl, itl_bounds)}
    if steps is not None:
        w["steps"] = steps
    if ttft:
        w["ttft"] = histogram(ttft, TTFT_BOUNDS)
    # The agent's p99 of the same window beside it (nearest rank over the draws).
    p99 = sorted(itl)[max(0, int(0.99 * len(itl)) - 1)] if itl else None
    values = {"generation_tokens_per_second": tps, "itl_p99_seconds": p99, "window": w}
    return from_stored(ended_at, {k: v for k, v in values.items() if v is not None}, full=True)


def stream(rng: random.Random, since: datetime, n: int, *, median: float, steps: int = 40, batch: int = 8,
           tps: float = 100.0, with_steps: bool = True) -> list[ReplicaSample]:
    """``n`` consecutive windows from ``since``, each reported at its end."""
    return [window(since + i * SCRAPE, engine_steps(rng, steps, batch, median), steps=steps if with_steps else None,
                   tps=tps) for i in range(1, n + 1)]
