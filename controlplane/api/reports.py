"""``POST /v1/agents/{node}/report``: the agent's report in, the node's desired state out.

The body is read by hand (not by a FastAPI body parameter) so that an oversized report is refused with 413
before it is buffered whole, and an unsupported protocol version is named before field validation fails on
fields this control plane does not know. Past the wire models' own bounds, a report is refused (422, naming the
field) for replicas on GPUs it does not list and for timestamps too far from this control plane's clock
(``agent.wire.gpu_problems``, ``clock_problems``); nothing of a refused report is stored. A report dropped as
out of order is answered 409 with the sequence this control plane holds (``agent.wire.OutOfOrder``), so the agent
knows and numbers its next report past it.

``POST /v1/agents/{node}/readings``: the reports an agent could not deliver while this control plane was away,
once it answers again, stored in place as history reading by reading (``controlplane.fleet.backfill``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Request, Response, status
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import OperationalError

from agent.wire import (
    PROTOCOL_VERSION,
    DesiredState,
    NodeReport,
    OutOfOrder,
    Readings,
    ReadingsAnswer,
    clock_problems,
    gpu_problems,
)
from controlplane.api.auth import AuthError
from controlplane.api.bodies import Rejected, read_body
from controlplane.api.context import AppContext, get_context
from controlplane.fleet.backfill import store_readings
from controlplane.fleet.sequencing import Verdict
from controlplane.fleet.writer import Backlogged, Written
from controlplane.security.roles import ON_BEHALF_OF_HEADER, Role
from controlplane.store.db import session_scope

SUPPORTED_PROTOCOL_VERSIONS = frozenset({PROTOCOL_VERSION})
# A batch of undelivered readings may be this many times ``max_report_bytes`` (the agent keeps its batches to
# ``agent.backlog.BATCH_BYTES``).
READINGS_BYTES_FACTOR = 4
# What a busy control plane asks agents to wait before retrying: about one report interval.
BACKLOG_RETRY_AFTER_SECONDS = 5

router = APIRouter(tags=["agents"])
T = TypeVar("T")


class Dropped(BaseModel):
    """The body of a 409: the report was dropped as out of order."""

    detail: OutOfOrder


def _json(body: bytes) -> Any:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Rejected(422, "malformed", f"body is not JSON: {exc}") from exc
    if isinstance(data, dict) and "protocol_version" in data:
        version = data["protocol_version"]
        # Only an integer can be a version this control plane does not speak; anything else (a string, an object)
        # is malformed, and validation names the field (422).
        if isinstance(version, int) and not isinstance(version, bool) and version not in SUPPORTED_PROTOCOL_VERSIONS:
            supported = ", ".join(str(v) for v in sorted(SUPPORTED_PROTOCOL_VERSIONS))
            raise Rejected(status.HTTP_400_BAD_REQUEST, "protocol_version",
                           f"unsupported protocol_version {version!r}; this control plane speaks {supported}")
    return data


def _parse(body: bytes, node: str, now: datetime, max_clock_skew: timedelta) -> NodeReport:
    data = _json(body)
    try:
        report = NodeReport.model_validate(data)
    except ValidationError as exc:
        raise Rejected(422, "malformed", json.loads(exc.json(include_url=False, include_input=False))) from exc
    for what, keys in (("replica name", [r.name for r in report.replicas]),
                       ("GPU index", [str(g.index) for g in report.gpus])):
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise Rejected(422, "malformed", f"{what} repeated in one report: {', '.join(repeated)}")
    if problems := gpu_problems(report):
        raise Rejected(422, "malformed", problems)
    if report.node != node:
        raise Rejected(status.HTTP_400_BAD_REQUEST, "node_mismatch",
                       f"report for node {report.node!r} posted to the path of node {node!r}")
    if problems := clock_problems(report, now, max_clock_skew):
        raise Rejected(422, "clock_skew", problems)
    return report


async def _admit(ctx: AppContext, request: Request, node: str, limit: int, what: str,
                 parse: Callable[[bytes], T]) -> T:
    """An agent's post for ``node``: its token checked, its body read (413 past ``limit``) and parsed; each
    refusal counted by reason."""
    try:
        # The on-behalf-of header is passed on to be refused: an agent never acts for anyone.
        ctx.auth.require(request.headers.get("authorization"), Role.AGENT, node=node,
                         on_behalf_of=request.headers.getlist(ON_BEHALF_OF_HEADER))
        return parse(await read_body(request, limit, what))
    except Rejected as exc:
        ctx.telemetry.reject(exc.reason)
        raise
    except AuthError as exc:
        ctx.telemetry.reject("unauthorized" if exc.status_code == 401 else "forbidden")
        raise


def _out_of_order(report: NodeReport, written: Written) -> HTTPException:
    """The 409 to a report dropped as out of order: what this control plane holds, and what to do about it."""
    assert written.last_sequence is not None and written.last_sent_at is not None
    held, held_at = written.last_sequence, written.last_sent_at
    detail = OutOfOrder(
        message=f"report {report.sequence} of node {report.node} (sent_at {report.sent_at.isoformat()}) dropped as "
                f"out of order: this control plane holds report {held}, sent_at {held_at.isoformat()}; number "
                f"the next report above {held} (an agent that restarted, a late retry, or two agents reporting as "
                f"node {report.node})",
        sequence=report.sequence, sent_at=report.sent_at, last_sequence=held, last_sent_at=held_at)
    return HTTPException(status.HTTP_409_CONFLICT, detail.model_dump(mode="json"))


@router.post(
    "/v1/agents/{node}/report",
    response_model=DesiredState,
    summary="Accept a node's report; answer its desired state",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/NodeReport"}}}}},
    responses={400: {"description": "wrong node in path, or unsupported protocol version"},
               401: {"description": "agent token missing"},
               403: {"description": "not an agent token, or one bound to another node"},
               409: {"model": Dropped, "description": "dropped as out of order: a sequence at or below the "
                     "node's last, sent no later; the answer holds the last sequence, to carry on past"},
               413: {"description": "report too large"},
               422: {"description": "malformed report, impossible values, or a clock too far from the control "
                     "plane's (max_clock_skew_seconds); the detail names each field"},
               503: {"description": "too many reports waiting to be written, the write timed out, or the database "
                     "is unavailable; retry, no sooner than Retry-After"}},
)
async def post_report(node: str, request: Request) -> Response:
    ctx = get_context(request)
    skew = timedelta(seconds=ctx.config.max_clock_skew_seconds)
    report = await _admit(ctx, request, node, ctx.config.max_report_bytes, "report",
                          lambda body: _parse(body, node, ctx.clock(), skew))
    # The report writer commits the reports that queue together in one transaction (see fleet/writer.py).
    try:
        written = ctx.reports.submit(report)
    except Backlogged as exc:
        ctx.telemetry.reject("backlogged")
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"control plane busy: {exc}; retry later",
                            headers={"Retry-After": str(BACKLOG_RETRY_AFTER_SECONDS)}) from exc
    try:
        outcome = await asyncio.wait_for(asyncio.wrap_future(written), ctx.config.report_write_timeout_seconds)
    except TimeoutError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the report was not written in time; retry",
                            headers={"Retry-After": str(BACKLOG_RETRY_AFTER_SECONDS)}) from exc
    except OperationalError as exc:  # the database is away (restarting, failing over): nothing was stored
        ctx.telemetry.reject("database_unavailable")
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the database is unavailable; retry later",
                            headers={"Retry-After": str(BACKLOG_RETRY_AFTER_SECONDS)}) from exc
    ctx.telemetry.reports_received.labels(outcome=outcome.verdict.value).inc()
    if outcome.verdict is Verdict.OUT_OF_ORDER:
        raise _out_of_order(report, outcome)
    request.app.state.jobs.poke()  # evaluate the policies soon after new evidence (debounced)
    # Serialised here, once: the answer is already a validated model (the hot path at 200 reports a second).
    return Response(outcome.answer.model_dump_json(), media_type="application/json")


def _parse_readings(body: bytes, node: str) -> Readings:
    data = _json(body)
    try:
        batch = Readings.model_validate(data)
    except ValidationError as exc:
        raise Rejected(422, "malformed", json.loads(exc.json(include_url=False, include_input=False))) from exc
    if batch.node != node or any(r.node != node for r in batch.readings):
        raise Rejected(status.HTTP_400_BAD_REQUEST, "node_mismatch",
                       f"readings of another node posted to the path of node {node!r}")
    return batch


@router.post(
    "/v1/agents/{node}/readings",
    response_model=ReadingsAnswer,
    summary="Store a node's undelivered readings (its reports while the control plane was away) as history",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/Readings"}}}}},
    responses={400: {"description": "wrong node in path, or unsupported protocol version"},
               401: {"description": "agent token missing"},
               403: {"description": "not an agent token, or one bound to another node"},
               413: {"description": "batch too large"},
               422: {"description": "malformed batch; the detail names each field"},
               503: {"description": "the database is unavailable; retry"}},
)
async def post_readings(node: str, request: Request) -> ReadingsAnswer:
    """Each reading is stored in place (its samples at its ``sent_at``), already held, or refused with the reason
    (``controlplane.fleet.backfill``); a refused one never fails the rest."""
    ctx = get_context(request)
    batch = await _admit(ctx, request, node, ctx.config.max_report_bytes * READINGS_BYTES_FACTOR, "readings",
                         lambda body: _parse_readings(body, node))

    def store() -> ReadingsAnswer:
        with session_scope(ctx.sessions) as session:
            return store_readings(
                session=session, batch=batch, now=ctx.clock(),
                full_resolution=timedelta(seconds=ctx.config.sample_full_resolution_seconds),
                max_skew=timedelta(seconds=ctx.config.max_clock_skew_seconds))

    try:
        answer = await asyncio.to_thread(store)
    except OperationalError as exc:
        ctx.telemetry.reject("database_unavailable")
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the database is unavailable; retry later",
                            headers={"Retry-After": str(BACKLOG_RETRY_AFTER_SECONDS)}) from exc
    if answer.stored:
        request.app.state.jobs.poke()  # the history behind the policies changed
    return answer


def register_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Add ``NodeReport`` and ``Readings`` to the OpenAPI components, since the routes read their bodies by hand."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in (NodeReport, Readings):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return openapi
