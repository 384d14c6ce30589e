"""Sending a ``NodeReport`` to the control plane and reading back its ``DesiredState``.

``POST {control_plane}/v1/agents/{node}/report`` with ``Authorization: Bearer <token>`` when a token is
configured. Only transport failures and non-2xx answers are retried (``ReportError``); the caller keeps
supervising on the last desired state while the control plane is away.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import httpx
from pydantic import ValidationError

from agent.retry import RETRY_CAP_SECONDS, next_attempt_in, report_retry_delay, retry_after_seconds
from agent.wire import DesiredState, NodeReport

__all__ = ["RETRY_CAP_SECONDS", "ReportError", "Reporter", "next_attempt_in", "report_retry_delay",
           "retry_after_seconds"]

class ReportError(Exception):
    """The report did not get a usable answer; retried after ``next_attempt_in``."""

    def __init__(self, message: str, retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(message)
        # What the control plane asked for with Retry-After (a 503 while its write backlog is full, a 429).
        self.retry_after = retry_after
        # The HTTP status of a refusal; None when no answer came (or it was unusable).
        self.status = status

    @property
    def refused_content(self) -> bool:
        """The control plane read the report and refused what it says (422): the same content fails again."""
        return self.status == 422


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
            raise ReportError(f"HTTP {response.status_code} from {self.url}: {response.text[:300]}", retry_after,
                              response.status_code)
        try:
            return DesiredState.model_validate_json(response.content)
        except ValidationError as exc:
            raise ReportError(f"unusable desired state from {self.url}: {exc}") from exc
