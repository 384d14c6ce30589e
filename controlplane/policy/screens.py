"""``screen``: proof, from a subject's fields and newest reading alone, that a condition finds nothing on it now.

A round at 1,000 nodes asks thirteen conditions of 16,000 subjects. Most answers are "nothing", and most are
told by a field (the replica is not FATAL; the GPU never logged an XID) or by the newest reading (TTFT under
its threshold now, so not over it for the whole window). A screened subject is neither judged nor remembered
by the incremental round (``incremental.Evaluator``): nothing is worked out for it, and the next round screens
it again, as cheaply.

Each screen is exact one way: where it says True, the condition's detector (``evaluate.detect_replica`` or
``detect_gpu``) returns None for that subject at that moment. Where it says False the detector decides.
``tests/policy/test_screens.py`` holds every screen to that on generated subjects.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from operator import attrgetter
from typing import Any

from agent.wire import ReplicaState
from controlplane.policy.conditions import (
    Condition,
    CrashLoopCondition,
    EccCondition,
    ErrorRateCondition,
    LeakCondition,
    OomCrashCondition,
    StallCondition,
    ThermalCondition,
    ThresholdCondition,
    XidCondition,
)
from controlplane.policy.detectors.slo import OPS
from controlplane.policy.detectors.thermal import temperature_limit

Screen = Callable[[Any], bool]
_ECC = attrgetter("ecc_uncorrected_total")
_EXITED_QUIET = (ReplicaState.READY, ReplicaState.ATTACHED)


def screen(cond: Condition, now: datetime) -> Screen | None:
    """A predicate on one subject of ``cond`` (a replica or a GPU): True only where the detector finds nothing
    now. None where no shortcut is exact."""
    if isinstance(cond, CrashLoopCondition):
        return lambda r: r.state != ReplicaState.FATAL
    if isinstance(cond, OomCrashCondition):
        return lambda r: r.last_exit_code is None or r.state in _EXITED_QUIET
    if isinstance(cond, XidCondition):
        # Counters are never negative (``wire.Count``): no rise within any window from a total of 0.
        return lambda g: g.xid_events_total == 0
    if isinstance(cond, EccCondition):
        # No rise without a count above 0 (counters are never negative, ``min_increase`` is at least 1).
        return lambda g: not any(map(_ECC, g.history))
    if isinstance(cond, ErrorRateCondition | LeakCondition):
        return lambda r: not r.serving  # judged only while it serves
    if isinstance(cond, StallCondition):
        return lambda r: not r.serving and r.state != ReplicaState.WEDGED
    if isinstance(cond, ThresholdCondition):
        return _threshold(cond, now)
    if isinstance(cond, ThermalCondition):
        return _thermal(cond, now)
    return None


def _threshold(cond: ThresholdCondition, now: datetime) -> Screen:
    """Not serving; or, where every sample of the window must be beyond (``min_share`` 1), the newest one is
    not (``slo.signal_span`` judges the newest sample first)."""
    signal, compare, threshold, whole = cond.signal, OPS[cond.op], cond.threshold, cond.min_share >= 1

    def calm(r: Any) -> bool:
        if not r.serving:
            return True
        if not whole:
            return False
        history = r.history
        if not history:
            return True
        newest = history[-1]
        if newest.at > now:
            return False  # stamped ahead of the round's clock: the detector finds which sample is newest now
        value = getattr(newest, signal)
        return value is None or not compare(float(value), threshold)

    return calm


def _thermal(cond: ThermalCondition, now: datetime) -> Screen:
    """The newest reading is neither at the GPU's limit nor throttled (``findings.held_for`` judges it first)."""

    def cool(g: Any) -> bool:
        history = g.history
        if not history:
            return True
        newest = history[-1]
        if newest.at > now or newest.throttle_reasons:
            return False
        temperature = newest.temperature_celsius
        return temperature is None or temperature < temperature_limit(cond, g)

    return cool
