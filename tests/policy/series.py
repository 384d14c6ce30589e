"""Small builders for realistic replica and GPU histories."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.wire import ReplicaState
from controlplane.policy.snapshot import FleetSnapshot, Gpu, GpuReading, Node, Replica, ReplicaSample

T0 = datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
GiB = 2**30
MiB = 2**20

Field = float | int | bool | list[str] | None | Callable[[float], Any]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def series(duration: float, interval: float = 10.0, start: float = 0.0, **fields: Field) -> list[ReplicaSample]:
    """Samples every ``interval`` seconds from ``start`` for ``duration``; a field is a constant or f(t)."""
    out = []
    steps = int(duration // interval) + 1
    for i in range(steps):
        t = start + i * interval
        values = {k: (v(t) if callable(v) else v) for k, v in fields.items()}
        out.append(ReplicaSample(at=at(t), **values))
    return out


def healthy(duration: float, interval: float = 10.0, start: float = 0.0, **over: Field) -> list[ReplicaSample]:
    """A replica serving steadily: TTFT p99 200 ms, tokens moving, canary fine."""
    base: dict[str, Field] = {
        "ttft_p99_seconds": 0.2, "itl_p99_seconds": 0.04, "requests_running": 12.0, "requests_waiting": 0.0,
        "generation_tokens_total": lambda t: 1000.0 + 400.0 * t, "generation_tokens_per_second": 400.0,
        "requests_per_second": 5.0, "errors_per_second": 0.0, "canary_ok": True, "canary_ttft_seconds": 0.05,
        "rss_bytes": 20 * GiB, "gpu_memory_bytes": 120 * GiB,
    }
    base.update(over)
    return series(duration, interval, start, **base)


def replica(name: str = "r1", node: str = "n1", model: str = "llama-8b", history: list[ReplicaSample] | None = None,
            args: list[str] | None = None, state: ReplicaState = ReplicaState.READY, **kw: Any) -> Replica:
    return Replica(node=node, name=name, model=model, state=state, ready=state == ReplicaState.READY,
                   engine_args=args if args is not None else ["--max-num-seqs", "256"], gpus=kw.pop("gpus", [0]),
                   history=history or [], **kw)


def gpu_readings(duration: float, interval: float = 10.0, **fields: Field) -> list[GpuReading]:
    steps = int(duration // interval) + 1
    return [GpuReading(at=at(i * interval), **{k: (v(i * interval) if callable(v) else v) for k, v in fields.items()})
            for i in range(steps)]


def gpu(index: int = 0, node: str = "n1", history: list[GpuReading] | None = None, **kw: Any) -> Gpu:
    kw.setdefault("memory_total_bytes", 141 * GiB)
    return Gpu(node=node, index=index, uuid=f"GPU-{node}-{index}", history=history or [], **kw)


def fleet(now: float, replicas: list[Replica], gpus: list[Gpu] | None = None,
          nodes: list[Node] | None = None) -> FleetSnapshot:
    names = sorted({r.node for r in replicas} | {g.node for g in gpus or []})
    return FleetSnapshot(now=at(now), replicas=replicas, gpus=gpus or [],
                         nodes=nodes or [Node(name=n, memory_total_bytes=512 * GiB) for n in names])


def noise(seed: int, sigma: float) -> Callable[[float], float]:
    """Seeded gaussian noise as a function of time (same t, same value)."""
    rng = random.Random(seed)
    cache: dict[float, float] = {}

    def value(t: float) -> float:
        if t not in cache:
            cache[t] = rng.gauss(0.0, sigma)
        return cache[t]

    return value
