"""Sending a ``NodeReport`` to the control plane and reading back its ``DesiredState``.

``POST {control_plane}/v1/agents/{node}/report`` with ``Authorization: Bearer <token>`` when a token is
configured. Only transport failures and non-2xx answers are retried (``ReportError``); the caller keeps
supervising on the last desired state while the control plane is away.
"""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from agent.wire import DesiredState, NodeReport


class ReportError(Exception):
    """The report did not get a usable answer; retried after ``report_retry_delay``."""


def report_retry_delay(failures: int, interval: float, cap: float = 60.0) -> float:
    """Seconds before the next attempt after ``failures`` consecutive failures: doubling, at most ``cap``."""
    return min(cap, interval * 2 ** min(max(failures - 1, 0), 16))


class Reporter:
    def __init__(self, client: httpx.AsyncClient, control_plane: str, node: str, token: str | None = None,
                 request_timeout: float = 10.0) -> None:
        self.client = client
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
            raise ReportError(f"HTTP {response.status_code} from {self.url}: {response.text[:300]}")
        try:
            return DesiredState.model_validate_json(response.content)
        except ValidationError as exc:
            raise ReportError(f"unusable desired state from {self.url}: {exc}") from exc
