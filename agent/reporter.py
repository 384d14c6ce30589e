"""Sending a ``NodeReport`` to the control plane and reading back its ``DesiredState``.

``POST {control_plane}/v1/agents/{node}/report`` with ``Authorization: Bearer <token>`` when a token is
configured. Only transport failures and non-2xx answers are retried (``ReportError``); the caller keeps
supervising on the last desired state while the control plane is away. Each failure says what it was
(``ReportError.summary``, ``kind``): unreachable, the token refused (401, 403), the report dropped as out of order
(409: the agent numbers its next report past the control plane's, ``sequence_past``), the report refused for this
host's clock or its content (422), or the control plane busy (429, 503).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from agent.retry import RETRY_CAP_SECONDS, next_attempt_in, report_retry_delay, retry_after_seconds
from agent.wire import INT64_MAX, DesiredState, NodeReport, OutOfOrder, ReadingsAnswer

__all__ = ["RETRY_CAP_SECONDS", "ReportError", "Reporter", "next_attempt_in", "report_retry_delay",
           "retry_after_seconds", "settled"]

Kind = Literal["unreachable", "token", "out_of_order", "clock", "refused", "busy", "error"]


class ReportError(Exception):
    """The report did not get a usable answer; retried after ``next_attempt_in``."""

    def __init__(self, message: str, retry_after: float | None = None, status: int | None = None, *,
                 detail: Any = None, summary: str | None = None) -> None:
        super().__init__(message)
        # What the control plane asked for with Retry-After (a 503 while its write backlog is full, a 429).
        self.retry_after = retry_after
        # The HTTP status of a refusal; None when no answer came (or it was unusable).
        self.status = status
        # The ``detail`` of the control plane's JSON answer, when it gave one.
        self.detail = detail
        self.summary = summary or (f"control plane unreachable ({message})" if status is None else
                                   f"control plane answered HTTP {status} ({message})")

    @property
    def kind(self) -> Kind:
        """What went wrong, for logging once per outage and again when it changes."""
        if self.status is None:
            return "unreachable"
        if self.status in (401, 403):
            return "token"
        if self.out_of_order is not None:
            return "out_of_order"
        if self.clock_skew:
            return "clock"
        if self.status in (429, 503):
            return "busy"
        return "refused" if 400 <= self.status < 500 else "error"

    @property
    def clock_skew(self) -> bool:
        """Refused (422) for this host's clock, too far from the control plane's: nothing the report says is wrong."""
        return self.status == 422 and any(p.get("type") == "clock_skew" for p in _problems(self.detail))

    @property
    def readings_kept(self) -> bool:
        """Whether the report's readings are worth keeping for later (``agent.backlog``): not when it was refused
        for its clock or its content (422), which would refuse them again."""
        return self.status != 422

    @property
    def refused_content(self) -> bool:
        """The control plane read the report and refused what it says (422): the same content fails again."""
        return self.status == 422 and not self.clock_skew

    @property
    def out_of_order(self) -> OutOfOrder | None:
        """The control plane's account of a report it dropped as out of order (409), when it gave one."""
        if self.status != 409:
            return None
        try:
            return OutOfOrder.model_validate(self.detail)
        except ValidationError:  # a 409 from something else (a proxy): nothing to carry on from
            return None

    def sequence_past(self, current: int) -> int:
        """The sequence to count on from: past the control plane's last one after a 409 that names it (the next
        report is then news to it), else ``current``. Never past what the wire carries."""
        dropped = self.out_of_order
        if dropped is None:
            return current
        return max(current, min(dropped.last_sequence, INT64_MAX - 1))


def _problems(detail: Any) -> list[dict[str, Any]]:
    return [p for p in detail if isinstance(p, dict)] if isinstance(detail, list) else []


def _detail(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body.get("detail") if isinstance(body, dict) else None


def _said(detail: Any, text: str) -> str:
    """What the control plane said, short: its problems' fields and messages, its detail, or the body."""
    problems = _problems(detail)
    if problems:
        return "; ".join(f"{'.'.join(str(part) for part in p.get('loc') or ())}: {p.get('msg')}"
                         for p in problems[:5])
    if isinstance(detail, str):
        return detail[:300]
    return text[:300]


def refusal_summary(status: int, detail: Any, text: str, *, control_plane: str, node: str, has_token: bool,
                    retry_after: float | None = None) -> str:
    """The log line for a control plane's non-2xx answer: what it refused, and what to check."""
    said = _said(detail, text)
    where = f"control plane {control_plane}"
    if status == 401:
        if not has_token:
            return (f"{where} wants a token (HTTP 401: {said}): set `token` (PITSTOP_AGENT_TOKEN) to one of its "
                    "agent tokens")
        return (f"{where} did not receive this agent's token (HTTP 401: {said}): check that no proxy between drops "
                "the Authorization header")
    if status == 403:
        return (f"{where} refused this agent's token (HTTP 403: {said}): check `token` (PITSTOP_AGENT_TOKEN) "
                f"against its agent tokens (revoked or rotated?); a token bound to a node reports only as that "
                f"node (this agent is {node})")
    if status == 409:
        try:
            dropped = OutOfOrder.model_validate(detail)
        except ValidationError:
            return f"{where} answered HTTP 409: {said}"
        return (f"{where} dropped report {dropped.sequence} as out of order: it holds report "
                f"{dropped.last_sequence} (sent_at {dropped.last_sent_at.isoformat()}), from before this agent "
                f"restarted or from another agent reporting as node {node}; numbering the next report from "
                f"{dropped.last_sequence + 1}")
    if status == 422:
        if any(p.get("type") == "clock_skew" for p in _problems(detail)):
            return f"{where} refused the report for this host's clock: {said}"
        return f"{where} refused the report (HTTP 422): {said}"
    if status in (429, 503):
        wait = f"; it asked for {retry_after:g} s" if retry_after is not None else ""
        return f"{where} busy (HTTP {status}: {said}){wait}"
    return f"{where} answered HTTP {status}: {said}"


def settled(report: NodeReport) -> NodeReport:
    """``report`` with no timestamp later than its ``sent_at``: a transition recorded before this host's clock was
    stepped back would otherwise read as being in the future, and the control plane refuses a report holding a
    time past its clock plus the skew it accepts, until that replica changes state again."""
    now = report.sent_at
    if all(r.state_since <= now for r in report.replicas) and all(e.at <= now for e in report.events):
        return report
    return report.model_copy(update={
        "replicas": [r if r.state_since <= now else r.model_copy(update={"state_since": now})
                     for r in report.replicas],
        "events": [e if e.at <= now else e.model_copy(update={"at": now}) for e in report.events],
    })


class Reporter:
    def __init__(self, client: httpx.AsyncClient, control_plane: str, node: str, token: str | None = None,
                 request_timeout: float = 10.0, wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.client = client
        self.wall = wall  # only to read a Retry-After given as a date
        self.control_plane = control_plane.rstrip("/")
        self.node = node
        self.url = f"{self.control_plane}/v1/agents/{node}/report"
        self.readings_url = f"{self.control_plane}/v1/agents/{node}/readings"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.request_timeout = request_timeout

    async def send(self, report: NodeReport) -> DesiredState:
        response = await self._post(self.url, settled(report).model_dump_json().encode())
        try:
            return DesiredState.model_validate_json(response.content)
        except ValidationError as exc:
            message = f"unusable desired state from {self.url}: {exc}"
            raise ReportError(message, summary=f"control plane {self.control_plane} answered with an unusable "
                                               f"desired state ({message})") from exc

    async def send_readings(self, body: bytes) -> ReadingsAnswer:
        """A ``Readings`` batch (``agent.backlog``); the control plane's account of each reading."""
        response = await self._post(self.readings_url, body)
        try:
            return ReadingsAnswer.model_validate_json(response.content)
        except ValidationError as exc:
            raise ReportError(f"unusable answer to readings from {self.readings_url}: {exc}") from exc

    async def _post(self, url: str, body: bytes) -> httpx.Response:
        try:
            response = await self.client.post(url, content=body, headers={
                **self.headers, "Content-Type": "application/json"}, timeout=self.request_timeout)
        except httpx.HTTPError as exc:
            raise ReportError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 300:
            code = response.status_code
            retry_after = (retry_after_seconds(response.headers.get("retry-after"), self.wall())
                           if code in (429, 503) else None)
            detail = _detail(response)
            summary = refusal_summary(code, detail, response.text, control_plane=self.control_plane,
                                      node=self.node, has_token=bool(self.headers), retry_after=retry_after)
            raise ReportError(f"HTTP {code} from {url}: {response.text[:300]}", retry_after, code,
                              detail=detail, summary=summary)
        return response
