"""Leak: a robust memory trend (Theil-Sen) projected to the limit.

Engine leaks are slow and real — host RSS in the EngineCore/worker children (vLLM #44175, #43639) and VRAM
(#17243). Theil-Sen (the median of pairwise slopes) shrugs off allocator steps and single outliers that
would swing a least-squares fit. Three gates keep flat noisy memory quiet: a minimum window, a minimum
slope, and most pairwise slopes pointing up (flat noise sits near one half).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from operator import attrgetter
from statistics import median

from controlplane.policy.conditions import LeakCondition
from controlplane.policy.detectors.findings import Finding, between, evidence_of, since
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import FleetSnapshot, Replica, ReplicaSample

# Points kept for the pairwise slopes: 120 points is 7,140 pairs, cheap at any history length.
MAX_POINTS = 120
# How much sooner than computed ``leak_due`` answers.
_EARLY = timedelta(milliseconds=1)


def _subsample(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    if len(points) <= limit:
        return list(points)
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(slope, intercept, rising fraction) of ``(x, y)`` points: median pairwise slope, median intercept,
    and the share of pairs whose slope is positive. Points are subsampled evenly to bound the cost."""
    pts = _subsample(points)
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts) for x2, y2 in pts[i + 1 :] if x2 != x1]
    if not slopes:
        return 0.0, pts[0][1] if pts else 0.0, 0.0
    slope = median(slopes)
    intercept = median(y - slope * x for x, y in pts)
    rising = sum(1 for s in slopes if s > 0) / len(slopes)
    return slope, intercept, rising


def rough_slope(points: Sequence[tuple[float, float]]) -> float:
    """A cheap robust slope: median of the last quarter minus median of the first, over their time apart."""
    q = max(2, len(points) // 4)
    return ends_slope(points[:q], points[-q:])


def ends_slope(head: Sequence[tuple[float, float]], tail: Sequence[tuple[float, float]]) -> float:
    """The slope between the medians of ``head`` and ``tail`` (a series' first and last quarter)."""
    dx = median(x for x, _ in tail) - median(x for x, _ in head)
    return (median(y for _, y in tail) - median(y for _, y in head)) / dx if dx > 0 else 0.0


def gpus_memory_total(totals: Iterable[int | None]) -> int | None:
    """A replica's GPUs' memory together; None unless every one of them reports its total (a partial sum would
    put the limit too low, and read as a leak)."""
    listed = list(totals)
    known = [t for t in listed if t is not None]
    return sum(known) if known and len(known) == len(listed) else None


def memory_limit(cond: LeakCondition, replica: Replica, snapshot: FleetSnapshot) -> int | None:
    """The bytes the resource would exhaust: configured, else host memory (rss) or the GPUs' memory."""
    if cond.limit_bytes is not None:
        return cond.limit_bytes
    if cond.resource == "rss":
        node = snapshot.node(replica.node)
        return node.memory_total_bytes if node else None
    return gpus_memory_total(g.memory_total_bytes for g in snapshot.gpus_of(replica))


@dataclass(frozen=True)
class _Trend:
    field: str
    series: list[ReplicaSample]
    span: float
    per_minute: float
    rising: float
    limit: int
    current: float
    seconds_left: float


def _flat(cond: LeakCondition, history: Sequence[ReplicaSample], field: str, start: datetime,
          now: datetime) -> bool:
    """Whether ``_trend`` stops at its first gates (too few samples, too short a window, or no slope between the
    first and last quarter), told without building a point: flat memory is the common case (8,000 replicas, two
    leak policies, each round). False when unsure: a missing reading makes the series be built one by one.

    The quarters' times are in order, so the median of their times is at their middle; only their values are
    sorted."""
    first, end = between(history, start, now)
    # Too few samples, or too short a span, whatever they read: leaving out missing readings only takes away.
    if end - first < cond.min_samples:
        return True
    t0 = history[first].at
    if (history[end - 1].at - t0).total_seconds() < cond.min_window:
        return True
    values = list(map(attrgetter(field), islice(history, first, end)))
    try:
        sum(values)
    except (TypeError, OverflowError):
        return False  # a missing reading among them (or no number)
    q = max(2, len(values) // 4)
    head, tail = history[first:first + q], history[end - q:end]
    dx = _middle(tail, t0) - _middle(head, t0)
    half = cond.min_slope_bytes_per_minute / 2
    if dx > 0 and float(max(values) - min(values)) / dx * 60.0 < half:
        return True  # the quarters' medians lie between the extremes: their slope is no steeper (no sort needed)
    dy = median(map(float, values[-q:])) - median(map(float, values[:q]))
    return (dy / dx if dx > 0 else 0.0) * 60.0 < half


def _middle(part: Sequence[ReplicaSample], t0: datetime) -> float:
    """``statistics.median`` of the seconds from ``t0`` to each of the time-ordered samples."""
    n = len(part)
    if n % 2 == 1:
        return (part[n // 2].at - t0).total_seconds()
    return ((part[n // 2 - 1].at - t0).total_seconds() + (part[n // 2].at - t0).total_seconds()) / 2


def _trend(cond: LeakCondition, replica: Replica, snapshot: FleetSnapshot, now: datetime) -> _Trend | None:
    """The replica's memory trend when it passes every gate but the horizon (None: flat, noisy, too short, or no
    limit to reach)."""
    field = "rss_bytes" if cond.resource == "rss" else "gpu_memory_bytes"
    start = now - timedelta(seconds=cond.lookback)
    if _flat(cond, replica.history, field, start, now):
        return None
    value = attrgetter(field)
    series = [s for s in since(replica.history, start, now) if value(s) is not None]
    if len(series) < cond.min_samples:
        return None
    t0 = series[0].at
    span = (series[-1].at - t0).total_seconds()
    if span < cond.min_window:
        return None
    # Flat memory is the common case: judge it on the first and last quarter alone, before building every
    # point and the pairwise slopes (8,000 replicas, two leak policies, each round).
    q = max(2, len(series) // 4)

    def xy(part: Sequence[ReplicaSample]) -> list[tuple[float, float]]:
        return [((s.at - t0).total_seconds(), float(value(s))) for s in part]

    if ends_slope(xy(series[:q]), xy(series[-q:])) * 60.0 < cond.min_slope_bytes_per_minute / 2:
        return None
    points = xy(series)
    slope, intercept, rising = theil_sen(points)
    per_minute = slope * 60.0
    if per_minute < cond.min_slope_bytes_per_minute or rising < cond.min_rising_fraction:
        return None
    limit = memory_limit(cond, replica, snapshot)
    if limit is None:
        return None
    ceiling = limit * cond.limit_ratio
    current = intercept + slope * (now - t0).total_seconds()  # the trend's level now, not one noisy reading
    seconds_left = max(0.0, (ceiling - current) / slope)
    return _Trend(field=field, series=series, span=span, per_minute=per_minute, rising=rising, limit=limit,
                  current=current, seconds_left=seconds_left)


def leak_due(cond: LeakCondition, replica: Replica, snapshot: FleetSnapshot, now: datetime) -> datetime | None:
    """When ``detect_leak`` finds this replica's leak if only the clock moves: the trend's level rises with time,
    so its time to the limit shrinks a second a second until it is within the horizon. A little early rather
    than late (float rounding); None when another gate holds it back, or it is found already."""
    return _due(cond, _trend(cond, replica, snapshot, now), now)


def detect_leak(cond: LeakCondition, replica: Replica, snapshot: FleetSnapshot, now: datetime) -> Finding | None:
    """A finding when memory climbs steadily fast enough to reach the limit within the horizon."""
    return _finding(cond, replica, _trend(cond, replica, snapshot, now))


def judge_leak(cond: LeakCondition, replica: Replica, snapshot: FleetSnapshot,
               now: datetime) -> tuple[Finding | None, datetime | None]:
    """``detect_leak`` and ``leak_due`` at ``now`` from one reading of the trend (the incremental round keeps the
    moment for a quiet answer: reading the trend again for it cost as much as the judgement)."""
    trend = _trend(cond, replica, snapshot, now)
    return _finding(cond, replica, trend), _due(cond, trend, now)


def _due(cond: LeakCondition, trend: _Trend | None, now: datetime) -> datetime | None:
    if trend is None or trend.seconds_left <= cond.horizon:
        return None
    return now + timedelta(seconds=trend.seconds_left - cond.horizon) - _EARLY


def _finding(cond: LeakCondition, replica: Replica, trend: _Trend | None) -> Finding | None:
    if trend is None or trend.seconds_left > cond.horizon:
        return None
    mib = 2**20
    return Finding(
        detector="leak",
        subject=replica.key,
        summary=f"{cond.resource} grows {trend.per_minute / mib:.1f} MiB/min over {format_duration(trend.span)}; "
        f"reaches {cond.limit_ratio:.0%} of {trend.limit / 2**30:.1f} GiB in {format_duration(trend.seconds_left)}",
        measured={"slope_bytes_per_minute": trend.per_minute, "rising_fraction": trend.rising,
                  "trend_bytes": trend.current, "limit_bytes": trend.limit, "seconds_to_limit": trend.seconds_left,
                  "window_seconds": trend.span},
        evidence=evidence_of(trend.series, [trend.field]),
    )
