"""SLO detectors: a signal beyond its threshold for a whole duration; the error ratio over a window."""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import datetime

from controlplane.policy.conditions import ErrorRateCondition, Op, ThresholdCondition
from controlplane.policy.detectors.findings import Finding, covering, due_at, evidence_of, held_for
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Replica, ReplicaSample

OPS: dict[Op, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}


def beyond(signal: str, op: Op, threshold: float) -> Callable[[ReplicaSample], bool]:
    """Whether one sample reads ``signal op threshold``; a missing reading does not (unknown is not a breach,
    nor a recovery)."""

    def holds(sample: ReplicaSample) -> bool:
        value = getattr(sample, signal)
        return value is not None and OPS[op](float(value), threshold)

    return holds


def signal_holds(samples: list[ReplicaSample], now: datetime, signal: str, op: Op, threshold: float,
                 seconds: float) -> list[ReplicaSample] | None:
    """The covering samples when ``signal op threshold`` held in every one over ``seconds``; a missing
    reading breaks the run."""
    return held_for(samples, now, seconds, beyond(signal, op, threshold))


def signal_share_holds(samples: list[ReplicaSample], now: datetime, signal: str, op: Op, threshold: float,
                       seconds: float, share: float) -> list[ReplicaSample] | None:
    """The covering samples when ``signal op threshold`` held in at least ``share`` of them over ``seconds``
    (samples without a reading do not count either way); ``share`` 1 is ``signal_holds``."""
    if share >= 1:
        return signal_holds(samples, now, signal, op, threshold, seconds)
    run = covering(samples, now, seconds)
    if run is None:
        return None
    known = [float(v) for s in run if (v := getattr(s, signal)) is not None]
    beyond = sum(1 for v in known if OPS[op](v, threshold))
    return run if known and beyond >= share * len(known) else None


def detect_threshold(cond: ThresholdCondition, replica: Replica, now: datetime,
                     samples: list[ReplicaSample] | None = None) -> Finding | None:
    """A finding when the condition's signal was beyond its threshold for the whole duration (in
    ``min_share`` of the samples over it)."""
    history = replica.history if samples is None else samples
    run = signal_share_holds(history, now, cond.signal, cond.op, cond.threshold, cond.for_, cond.min_share)
    if run is None:
        return None
    values = [float(v) for s in run if (v := getattr(s, cond.signal)) is not None]
    latest = values[-1]
    beyond = sum(1 for v in values if OPS[cond.op](v, cond.threshold))
    share = "" if cond.min_share >= 1 else f" in {beyond} of {len(values)} samples"
    return Finding(
        detector="threshold",
        subject=replica.key,
        summary=f"{cond.signal} {cond.op} {cond.threshold:g}{share} for {format_duration(cond.for_)} "
        f"(now {latest:.4g}, worst {max(values) if cond.op[0] == '>' else min(values):.4g})",
        measured={"latest": latest, "max": max(values), "min": min(values), "samples": len(run),
                  "beyond": beyond},
        evidence=evidence_of(run, [cond.signal]),
    )


def threshold_due(cond: ThresholdCondition, replica: Replica, now: datetime) -> datetime | None:
    """When ``detect_threshold`` finds the breach under way if it goes on (``findings.due_at``); None when there
    is none under way, or when only a share of the samples must cross (no moment can be told in advance)."""
    if cond.min_share < 1:
        return None
    return due_at(replica.history, now, cond.for_, beyond(cond.signal, cond.op, cond.threshold))


def detect_error_rate(cond: ErrorRateCondition, replica: Replica, now: datetime) -> Finding | None:
    """A finding when errors per request over the window exceed the threshold, at meaningful traffic."""
    run = covering(replica.history, now, cond.for_)
    if run is None:
        return None
    pairs = [(s.errors_per_second, s.requests_per_second) for s in run]
    known = [(e, r) for e, r in pairs if e is not None and r is not None]
    if len(known) < max(2, len(run) // 2):
        return None
    errors = sum(e for e, _ in known)
    requests = sum(r for _, r in known)
    if requests / len(known) < cond.min_requests_per_second or requests <= 0:
        return None
    ratio = errors / requests
    if ratio <= cond.threshold:
        return None
    return Finding(
        detector="error_rate",
        subject=replica.key,
        summary=f"error ratio {ratio:.3%} over {format_duration(cond.for_)} (threshold {cond.threshold:.3%})",
        measured={"error_ratio": ratio, "requests_per_second": requests / len(known)},
        evidence=evidence_of(run, ["errors_per_second", "requests_per_second"]),
    )
