"""When time alone can change what a detector finds on a subject whose inputs stayed the same: the moments a quiet
answer holds until (``incremental.Evaluator``; docs/design.md, "Rounds at fleet scale")."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from controlplane.policy.conditions import (
    Condition,
    EccCondition,
    ErrorRateCondition,
    LeakCondition,
    StallCondition,
    ThermalCondition,
    ThresholdCondition,
    XidCondition,
)
from controlplane.policy.detectors.findings import STALE_AFTER_SECONDS

_STALE = timedelta(seconds=STALE_AFTER_SECONDS)


def windows(cond: Condition) -> tuple[float, ...]:
    if isinstance(cond, ThresholdCondition | ErrorRateCondition | StallCondition | ThermalCondition):
        return (cond.for_,)
    if isinstance(cond, XidCondition | EccCondition):
        return (cond.within,)
    if isinstance(cond, LeakCondition):
        return (cond.lookback,)
    return ()


def _at(sample: Any) -> datetime:
    at: datetime = sample.at
    return at


def recheck(cond: Condition, history: Sequence[Any], since: datetime | None, now: datetime, key: str,
            moments: dict[tuple[str, float], datetime | None]) -> datetime | None:
    """The first moment, at or after ``now``, from which time alone could change what ``cond`` finds on a subject
    with this history (None: only a new input can). A moment equal to ``now`` means "any later round": window
    bounds are inclusive in some detectors and exclusive in others, so each edge counts from the instant it is
    reached. ``moments``: this round's answers by subject and window, shared by the policies."""
    found: list[datetime | None] = [moment(history, since, now, key, -1.0, moments)]
    found += [moment(history, since, now, key, window, moments) for window in windows(cond)]
    known = [m for m in found if m is not None]
    return min(known) if known else None


def moment(history: Sequence[Any], since: datetime | None, now: datetime, key: str, window: float,
           moments: dict[tuple[str, float], datetime | None]) -> datetime | None:
    """The first moment at or after ``now`` one window (``window`` < 0: none, the history's own edges) changes."""
    if (key, window) in moments:
        return moments[(key, window)]
    found: list[datetime] = []
    if window < 0:
        if history:
            found.append(history[-1].at + _STALE)  # the newest sample turns stale
            ahead = bisect_right(history, now, key=_at)
            if ahead < len(history):  # stamped after this round's clock (a skewed agent): it enters later
                found.append(history[ahead].at)
    else:
        span = timedelta(seconds=window)
        # The oldest sample still inside the window leaves it next (and a history too short for a ``for`` first
        # covers it then).
        first = bisect_left(history, now - span, key=_at)
        if first < len(history):
            found.append(history[first].at + span)
        if since is not None:  # ``for`` since the replica's state began (a WEDGED verdict held long enough)
            found.append(since + span)
    later = [m for m in found if m >= now]
    moments[(key, window)] = min(later) if later else None
    return moments[(key, window)]
