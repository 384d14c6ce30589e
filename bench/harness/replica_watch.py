"""What the agent reports about its replicas, polled once a second, and the figures a governed run is judged on.

``ReplicaWatch`` keeps one ``Tick`` per poll: each replica's state, ``--max-num-seqs``, ITL p99 (the agent's
per-scrape window), generation tokens counter and generation. The functions below are pure over ticks: when
the SLO was met on every replica (first, and for good), the value the fleet ran at the end, and throughput
from the engines' own token counters over a span without restarts. The SLO is read the way the shipped
``itl-slo`` policy reads it: the per-second ITL p99 above the threshold in fewer than ``min_share`` of the
readings over the condition's ``for`` (prefill bursts make single readings spike).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from controlplane.policy.engine_args import get_int_flag


@dataclass(frozen=True)
class Reading:
    state: str
    max_num_seqs: int | None
    itl_p99_s: float | None
    tokens_total: float | None
    generation: int


@dataclass(frozen=True)
class Tick:
    t: float  # seconds since the watch started
    replicas: dict[str, Reading]


def reading(status: dict[str, Any]) -> Reading:
    """One replica's poll; its ``max_num_seqs`` is the running limit: the live cap in effect where its plug-in
    is active (no restart to change it), else the ``--max-num-seqs`` it was started with."""
    engine = status.get("engine") or {}
    live = status.get("live_cap")
    flag = get_int_flag(status.get("engine_args") or [], "--max-num-seqs")
    return Reading(state=str(status.get("state")), max_num_seqs=int(live) if live is not None else flag,
                   itl_p99_s=engine.get("itl_p99_seconds"), tokens_total=engine.get("generation_tokens_total"),
                   generation=int(status.get("generation") or 0))


@dataclass
class ReplicaWatch:
    """Polls ``{agent}/v1/replicas`` every ``interval`` seconds in a thread until ``stop()``."""

    agent: str
    names: list[str]
    interval: float = 1.0
    ticks: list[Tick] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.interval):
                try:
                    body = client.get(f"{self.agent}/v1/replicas").json()
                except (httpx.HTTPError, ValueError):
                    continue
                got = {s["name"]: reading(s) for s in body if s.get("name") in self.names}
                self.ticks.append(Tick(time.monotonic() - self.started, got))

    def start(self) -> ReplicaWatch:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> list[Tick]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.ticks


def window_meets(ticks: list[Tick], end: int, names: list[str], threshold: float, window: float,
                 share: float) -> bool:
    """The SLO as the itl-slo policy reads it, over the ``window`` seconds up to tick ``end``: every replica
    READY throughout, with ITL p99 above ``threshold`` in fewer than ``share`` of its readings."""
    t = ticks[end].t
    if ticks[0].t > t - window:
        return False  # not a whole window of readings yet
    span = [tick for tick in ticks[:end + 1] if tick.t > t - window]
    for name in names:
        readings = [tick.replicas.get(name) for tick in span]
        if any(r is None or r.state != "READY" for r in readings):
            return False
        known = [r.itl_p99_s for r in readings if r is not None and r.itl_p99_s is not None]
        if not known or sum(1 for v in known if v > threshold) >= share * len(known):
            return False
    return True


def slo_met(ticks: list[Tick], names: list[str], threshold: float, window: float,
            share: float) -> tuple[float | None, float | None]:
    """(the first tick at which the SLO held over its window on every replica, the first tick from which it
    held at every tick to the end)."""
    verdicts = [window_meets(ticks, i, names, threshold, window, share) for i in range(len(ticks))]
    first = next((ticks[i].t for i, ok in enumerate(verdicts) if ok), None)
    for_good = None
    for i, ok in enumerate(verdicts):
        if not ok:
            for_good = None
        elif for_good is None:
            for_good = ticks[i].t
    return first, for_good


def last_breach(ticks: list[Tick], names: list[str], threshold: float) -> float | None:
    """When a replica last read ITL p99 above ``threshold`` (after it, every reading met it); None: never."""
    return max((t.t for t in ticks for n in names
                if (r := t.replicas.get(n)) is not None and r.itl_p99_s is not None and r.itl_p99_s > threshold),
               default=None)


def converged(ticks: list[Tick], names: list[str]) -> float | None:
    """The first tick from which every replica was READY at its final value (its --max-num-seqs, or its live
    cap) to the end; None without readings."""
    final = final_values(ticks, names)
    since = None
    for tick in ticks:
        there = all((r := tick.replicas.get(n)) is not None and r.state == "READY" and r.max_num_seqs == final[n]
                    for n in names)
        since = (since if since is not None else tick.t) if there else None
    return since


def breach_share(ticks: list[Tick], names: list[str], threshold: float, since: float) -> float | None:
    """The share of readings after ``since``, over all replicas, with ITL p99 above ``threshold``."""
    known = [r.itl_p99_s for t in ticks if t.t >= since for n in names
             if (r := t.replicas.get(n)) is not None and r.itl_p99_s is not None]
    return sum(1 for v in known if v > threshold) / len(known) if known else None


def final_values(ticks: list[Tick], names: list[str]) -> dict[str, int | None]:
    last = ticks[-1].replicas if ticks else {}
    return {n: last[n].max_num_seqs if n in last else None for n in names}


def throughput(ticks: list[Tick], names: list[str], since: float) -> float | None:
    """Generation tokens per second summed over replicas, from each engine's counter after ``since``.

    A counter that went down is an engine that restarted: it counts from zero (never a negative rate).
    """
    span = [t for t in ticks if t.t >= since and all(n in t.replicas for n in names)]
    if len(span) < 2 or span[-1].t <= span[0].t:
        return None
    total = 0.0
    for name in names:
        counts = [c for t in span if (c := t.replicas[name].tokens_total) is not None]
        total += sum(b - a if b >= a else b for a, b in pairwise(counts))
    return total / (span[-1].t - span[0].t)


def last_restart(ticks: list[Tick], names: list[str]) -> float:
    """When any replica last changed generation or left READY (0 when none did)."""
    latest = 0.0
    seen: dict[str, int] = {}
    for tick in ticks:
        for name in names:
            r = tick.replicas.get(name)
            if r is None:
                continue
            if (name in seen and seen[name] != r.generation) or r.state != "READY":
                latest = tick.t
            seen[name] = r.generation
    return latest
