"""``POST /v1/agents/{node}/report``: the agent's report in, the node's desired state out.

The body is read by hand (not by a FastAPI body parameter) so that an oversized report is refused with 413
before it is buffered whole, and an unsupported protocol version is named before field validation fails on
fields this control plane does not know.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response, status
from pydantic import ValidationError

from agent.wire import PROTOCOL_VERSION, DesiredState, NodeReport
from controlplane.api.auth import AuthError
from controlplane.api.bodies import Rejected, read_body
from controlplane.api.context import get_context
from controlplane.fleet.writer import Backlogged
from controlplane.security.roles import Role

SUPPORTED_PROTOCOL_VERSIONS = frozenset({PROTOCOL_VERSION})
# What a busy control plane asks agents to wait before retrying: about one report interval.
BACKLOG_RETRY_AFTER_SECONDS = 5

router = APIRouter(tags=["agents"])


def _parse(body: bytes, node: str) -> NodeReport:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Rejected(422, "malformed", f"body is not JSON: {exc}") from exc
    if isinstance(data, dict) and "protocol_version" in data:
        version = data["protocol_version"]
        if version not in SUPPORTED_PROTOCOL_VERSIONS:
            supported = ", ".join(str(v) for v in sorted(SUPPORTED_PROTOCOL_VERSIONS))
            raise Rejected(status.HTTP_400_BAD_REQUEST, "protocol_version",
                           f"unsupported protocol_version {version!r}; this control plane speaks {supported}")
    try:
        report = NodeReport.model_validate(data)
    except ValidationError as exc:
        raise Rejected(422, "malformed", json.loads(exc.json(include_url=False, include_input=False))) from exc
    for what, keys in (("replica name", [r.name for r in report.replicas]),
                       ("GPU index", [str(g.index) for g in report.gpus])):
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise Rejected(422, "malformed", f"{what} repeated in one report: {', '.join(repeated)}")
    if report.node != node:
        raise Rejected(status.HTTP_400_BAD_REQUEST, "node_mismatch",
                       f"report for node {report.node!r} posted to the path of node {node!r}")
    return report


@router.post(
    "/v1/agents/{node}/report",
    response_model=DesiredState,
    summary="Accept a node's report; answer its desired state",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/NodeReport"}}}}},
    responses={400: {"description": "wrong node in path, or unsupported protocol version"},
               401: {"description": "agent token missing"},
               403: {"description": "not an agent token, or one bound to another node"},
               413: {"description": "report too large"}, 422: {"description": "malformed report"},
               503: {"description": "too many reports waiting to be written, or the write timed out; retry"}},
)
async def post_report(node: str, request: Request) -> Response:
    ctx = get_context(request)
    try:
        ctx.auth.require(request.headers.get("authorization"), Role.AGENT, node=node)
        body = await read_body(request, ctx.config.max_report_bytes, "report")
        report = _parse(body, node)
    except Rejected as exc:
        ctx.telemetry.reject(exc.reason)
        raise
    except AuthError as exc:
        ctx.telemetry.reject("unauthorized" if exc.status_code == 401 else "forbidden")
        raise
    # The report writer commits the reports that queue together in one transaction (see fleet/writer.py).
    try:
        written = ctx.reports.submit(report)
    except Backlogged as exc:
        ctx.telemetry.reject("backlogged")
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"control plane busy: {exc}; retry later",
                            headers={"Retry-After": str(BACKLOG_RETRY_AFTER_SECONDS)}) from exc
    try:
        verdict, answer = await asyncio.wait_for(asyncio.wrap_future(written),
                                                 ctx.config.report_write_timeout_seconds)
    except TimeoutError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the report was not written in time; retry",
                            headers={"Retry-After": str(BACKLOG_RETRY_AFTER_SECONDS)}) from exc
    ctx.telemetry.reports_received.labels(outcome=verdict.value).inc()
    request.app.state.jobs.poke()  # evaluate the policies soon after new evidence (debounced)
    # Serialised here, once: the answer is already a validated model (the hot path at 200 reports a second).
    return Response(answer.model_dump_json(), media_type="application/json")


def register_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Add ``NodeReport`` to the OpenAPI components, since the route reads its body by hand."""
    schema = NodeReport.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    components.update(defs)
    components["NodeReport"] = schema
    return openapi
