"""When a policy's condition was first met by what the control plane stored, to measure the time past it.

A policy with ``for: 5s`` cannot act sooner than five seconds after the first sample that crossed its
threshold; whatever comes after that is the pipeline's own time (the round waiting for its turn, the
snapshot, the record). These functions find that moment in the store's samples, as the product reads them
(``build_snapshot``), with the product's own predicates. Samples are filed under their report's ``sent_at``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from controlplane.policy.conditions import ThermalCondition, ThresholdCondition
from controlplane.policy.detectors.findings import Timed
from controlplane.policy.detectors.slo import OPS, signal_share_holds
from controlplane.policy.detectors.thermal import temperature_limit
from controlplane.policy.snapshot import Gpu, GpuReading, ReplicaSample

T = TypeVar("T", bound=Timed)


@dataclass(frozen=True)
class Due:
    """The first crossing sample's time and when the condition was first met (``for:`` later, or later still
    when another piece of evidence came after it)."""

    crossed_at: datetime
    due_at: datetime
    by: str = "for"  # what came last: the ``for:`` after the crossing, or (stall) the agent's verdict


def run_start(samples: Sequence[T], until: datetime, holds: Callable[[T], bool]) -> T | None:
    """The first sample of the unbroken run that ``holds`` and ends with the last sample at or before
    ``until``; None when that last sample does not hold (or there is none)."""
    upto = [s for s in samples if s.at <= until]
    if not upto or not holds(upto[-1]):
        return None
    i = len(upto) - 1
    while i > 0 and holds(upto[i - 1]):
        i -= 1
    return upto[i]


def threshold_due(cond: ThresholdCondition, history: Sequence[ReplicaSample], until: datetime) -> Due | None:
    """A threshold condition: when the run of moments that ends at ``until`` with the condition met began.

    In every sample (``min_share`` 1): the first crossing sample of the run, plus ``for:``. In a share of them:
    the condition, as the product judges it (``signal_share_holds``), is met at ``until``; the window's content
    changes only when a sample arrives or the oldest leaves (a sample's time plus ``for:``), so the moments to
    try are those, walked back from ``until`` while it stays met. The crossing is that first moment's window's
    first reading beyond the threshold."""
    if cond.min_share >= 1:
        def holds(sample: ReplicaSample) -> bool:
            value = getattr(sample, cond.signal)
            return value is not None and OPS[cond.op](float(value), cond.threshold)

        first = run_start(history, until, holds)
        return None if first is None else Due(first.at, first.at + timedelta(seconds=cond.for_))

    def met(at: datetime) -> list[ReplicaSample] | None:
        return signal_share_holds(list(history), at, cond.signal, cond.op, cond.threshold, cond.for_,
                                  cond.min_share)

    if met(until) is None:
        return None
    span = timedelta(seconds=cond.for_)
    moments = sorted({m for s in history for m in (s.at, s.at + span) if m < until}, reverse=True)
    since = until
    for moment in moments:
        if met(moment) is None:
            break
        since = moment
    run = met(since)
    assert run is not None
    crossed = next(s for s in run if (v := getattr(s, cond.signal)) is not None
                   and OPS[cond.op](float(v), cond.threshold))
    return Due(crossed.at, since)


def thermal_due(cond: ThermalCondition, gpu: Gpu, until: datetime) -> Due | None:
    """The thermal detector's rule: at or past the device's limit, or throttled for heat, in every reading."""
    limit = temperature_limit(cond, gpu)
    words = [w.lower() for w in cond.throttle_reasons]

    def hot(reading: GpuReading) -> bool:
        warm = reading.temperature_celsius is not None and reading.temperature_celsius >= limit
        return warm or any(w in r.lower() for r in reading.throttle_reasons for w in words)

    first = run_start(gpu.history, until, hot)
    return None if first is None else Due(first.at, first.at + timedelta(seconds=cond.for_))


def stall_due(for_seconds: float, history: Sequence[ReplicaSample], until: datetime,
              wedged_at: datetime | None) -> Due | None:
    """The stall detector on a WEDGED replica: no generation token for ``for:``, counted from the first sample
    that read the counter at its final value, and the agent's WEDGED verdict received."""
    totals = [s for s in history if s.at <= until and s.generation_tokens_total is not None]
    if not totals or wedged_at is None:
        return None
    final = totals[-1].generation_tokens_total
    first = run_start(totals, until, lambda s: s.generation_tokens_total == final)
    if first is None:
        return None
    flat = first.at + timedelta(seconds=for_seconds)
    return Due(first.at, max(flat, wedged_at), "for" if flat >= wedged_at else "verdict")
