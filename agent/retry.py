"""Retrying a request over the network without a thundering herd: doubling backoff, full jitter, Retry-After.

Shared by the agent's reports and the control plane's notification outbox. Pure: the caller passes the random
source and the time.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRY_CAP_SECONDS = 60.0
# An agent's reports back off to at most this many report intervals (and 10 s to 60 s): the control plane
# calls a node stale after 30 s without a report, so an agent that waited a minute after an outage came back
# to a node already marked stale, and the fleet took a minute to be current again (59.6 s against 16.3 s
# without jitter, 1,000 agents at 5 s). Spread over 20 s, a restarted control plane still meets 50 reports/s
# more than its steady load, not the fleet at once.
REPORT_CAP_INTERVALS = 4.0


def report_retry_delay(failures: int, interval: float, cap: float = RETRY_CAP_SECONDS) -> float:
    """The longest wait before the next attempt after ``failures`` consecutive failures: doubling, at most
    ``cap``."""
    return min(cap, interval * 2 ** min(max(failures - 1, 0), 16))


def next_attempt_in(failures: int, interval: float, retry_after: float | None, rng: random.Random,
                    cap: float = RETRY_CAP_SECONDS) -> float:
    """Seconds to wait before the next report: "full jitter" over the backoff, never sooner than Retry-After.

    Without jitter every agent that lost the control plane at the same moment retries at the same moments,
    and a restarted control plane meets its whole fleet at once, again and again. Retry-After is honoured up
    to ``cap``: a control plane cannot silence its agents for longer than their own backoff would. After it
    the wait is spread over up to one interval more: agents refused at the same moment are all told the same
    number of seconds, and waiting exactly that long would bring them back together."""
    backoff = report_retry_delay(failures, interval, cap)
    if retry_after is None:
        return rng.uniform(0.0, backoff)
    return min(cap, min(retry_after, cap) + rng.uniform(0.0, min(interval, backoff)))


def report_retry_cap(interval: float) -> float:
    """The longest an agent reporting every ``interval`` seconds waits between two attempts."""
    return min(RETRY_CAP_SECONDS, max(10.0, REPORT_CAP_INTERVALS * interval))


def report_wait(failures: int, interval: float, retry_after: float | None, rng: random.Random) -> float:
    """``next_attempt_in`` for an agent's reports: capped at ``report_retry_cap``."""
    return next_attempt_in(failures, interval, retry_after, rng, cap=report_retry_cap(interval))


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A Retry-After header's delay in seconds: delay-seconds or an HTTP-date (RFC 9110, 10.2.3); None when
    absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())
