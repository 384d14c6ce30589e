"""When to run a planned (leak) restart: before projected exhaustion, in the next low-traffic window if there is time.

Pure. Traffic is forecast from yesterday: the request rate the replica's model had 24 h before each candidate
moment. No history for the span means no forecast, and the restart runs at once rather than on a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

DAY = timedelta(days=1)
STEP = timedelta(minutes=5)
# Below this much slack there is no window worth waiting for.
MIN_SLACK = timedelta(minutes=15)
# Restart with this share of the projected time to exhaustion still left (the projection is a trend, not a law).
SAFETY = 0.8
RatePoint = tuple[datetime, float]


def restart_deadline(now: datetime, within_seconds: float, seconds_to_limit: float | None) -> datetime:
    """The latest safe moment: the policy's ``within``, or earlier when exhaustion is nearer."""
    slack = within_seconds
    if seconds_to_limit is not None:
        slack = min(slack, max(0.0, seconds_to_limit * SAFETY))
    return now + timedelta(seconds=slack)


def _rate_near(history: Sequence[RatePoint], moment: datetime) -> float | None:
    near = [rate for at, rate in history if abs(at - moment) <= STEP]
    return sum(near) / len(near) if near else None


def plan_restart(now: datetime, deadline: datetime, history: Sequence[RatePoint]) -> tuple[datetime, str]:
    """(not before, why): the quietest forecast moment in [now, deadline], or now when there is no time or data."""
    if deadline - now < MIN_SLACK:
        return now, f"exhaustion or the policy's limit is {(deadline - now).total_seconds():.0f}s away: at once"
    best: tuple[float, datetime] | None = None
    moment = now
    while moment <= deadline:
        rate = _rate_near(history, moment - DAY)
        if rate is not None and (best is None or rate < best[0]):
            best = (rate, moment)
        moment += STEP
    if best is None:
        return now, "no request-rate history for this span a day ago: at once"
    rate, at = best
    if at == now:
        return now, f"now is the quietest moment before the deadline ({rate:.2f} req/s a day ago)"
    return at, (f"quietest forecast moment before {deadline.isoformat()}: {at.isoformat()} "
                f"({rate:.2f} req/s a day ago)")
