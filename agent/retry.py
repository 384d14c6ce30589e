"""Retrying a request over the network without a thundering herd: doubling backoff, full jitter, Retry-After.

Shared by the agent's reports and the control plane's notification outbox. Pure: the caller passes the random
source and the time.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRY_CAP_SECONDS = 60.0


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
