"""Sending a ``NodeReport`` to the control plane and reading back its ``DesiredState``.

``POST {control_plane}/v1/agents/{node}/report`` with ``Authorization: Bearer <token>`` when a token is
configured. Only transport failures and non-2xx answers are retried (``ReportError``); the caller keeps
supervising on the last desired state while the control plane is away.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
from pydantic import ValidationError

from agent.wire import DesiredState, NodeReport

RETRY_CAP_SECONDS = 60.0


class ReportError(Exception):
    """The report did not get a usable answer; retried after ``next_attempt_in``."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        # What the control plane asked for with Retry-After (a 503 while its write backlog is full, a 429).
        self.retry_after = retry_after


def report_retry_delay(failures: int, interval: float, cap: float = RETRY_CAP_SECONDS) -> float:
    """The longest wait before the next attempt after ``failures`` consecutive failures: doubling, at most
    ``cap``."""
    return min(cap, interval * 2 ** min(max(failures - 1, 0), 16))


def next_attempt_in(failures: int, interval: float, retry_after: float | None, rng: random.Random,
                    cap: float = RETRY_CAP_SECONDS) -> float:
    """Seconds to wait before the next report: "full jitter" over the backoff, never sooner than Retry-After.

    Without jitter every agent that lost the control plane at the same moment retries at the same moments,
    and a restarted control plane meets its whole fleet at once, again and again. Retry-After is honoured up
    to ``cap``: a control plane cannot silence its agents for longer than their own backoff would."""
    wait = rng.uniform(0.0, report_retry_delay(failures, interval, cap))
    return max(wait, min(retry_after, cap)) if retry_after is not None else wait


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


class Reporter:
    def __init__(self, client: httpx.AsyncClient, control_plane: str, node: str, token: str | None = None,
                 request_timeout: float = 10.0, wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.client = client
        self.wall = wall  # only to read a Retry-After given as a date
        self.url = f"{control_plane.rstrip('/')}/v1/agents/{node}/report"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.request_timeout = request_timeout

    async def send(self, report: NodeReport) -> DesiredState:
        try:
            response = await self.client.post(self.url, content=report.model_dump_json(), headers={
                **self.headers, "Content-Type": "application/json"}, timeout=self.request_timeout)
        except httpx.HTTPError as exc:
            raise ReportError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 300:
            retry_after = (retry_after_seconds(response.headers.get("retry-after"), self.wall())
                           if response.status_code in (429, 503) else None)
            raise ReportError(f"HTTP {response.status_code} from {self.url}: {response.text[:300]}", retry_after)
        try:
            return DesiredState.model_validate_json(response.content)
        except ValidationError as exc:
            raise ReportError(f"unusable desired state from {self.url}: {exc}") from exc
