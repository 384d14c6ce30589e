"""Liveness, readiness (the database answers) and the control plane's own /metrics."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from controlplane.api.context import AppContext, get_context
from controlplane.fleet.queries import count_nodes_by_status
from controlplane.notify.outbox import backlog
from controlplane.store.db import ping, session_scope
from controlplane.store.models import ActionRow

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers")
def readyz(request: Request) -> JSONResponse:
    try:
        ping(get_context(request).engine)
    except SQLAlchemyError as exc:
        return JSONResponse({"status": "unavailable", "detail": type(exc).__name__}, status_code=503)
    return JSONResponse({"status": "ok"})


def _refresh_gauges(ctx: AppContext) -> None:
    with session_scope(ctx.sessions) as session:
        counts = count_nodes_by_status(session=session, now=ctx.clock(), stale_after=ctx.stale_after)
        actions = session.execute(select(ActionRow.kind, ActionRow.state, func.count())
                                  .group_by(ActionRow.kind, ActionRow.state)).all()
    for status, count in counts.items():
        ctx.telemetry.nodes.labels(status=status.value).set(count)
        pending, oldest = backlog(session, ctx.clock())
    for kind, state, n in actions:
        ctx.telemetry.actions.labels(kind=kind, state=state).set(n)
    ctx.telemetry.notifications_pending.set(pending)
    ctx.telemetry.notification_oldest_pending.set(oldest)


@router.get("/metrics", summary="Prometheus metrics of the control plane itself")
async def metrics(request: Request) -> Response:
    ctx = get_context(request)
    # A scrape during a database outage still serves latency and report counters.
    with contextlib.suppress(SQLAlchemyError):
        await run_in_threadpool(_refresh_gauges, ctx)
    ctx.telemetry.leader.set(1 if ctx.leadership.is_leader else 0)
    ctx.telemetry.report_backlog.set(ctx.reports.pending)
    return Response(generate_latest(ctx.telemetry.registry), media_type=CONTENT_TYPE_LATEST)
