"""Liveness, readiness (the database answers) and the control plane's own /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from controlplane.api.context import get_context
from controlplane.store.db import ping

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


@router.get("/metrics", summary="Prometheus metrics of the control plane itself")
async def metrics(request: Request) -> Response:
    ctx = get_context(request)
    ctx.telemetry.leader.set(1 if ctx.leadership.is_leader else 0)
    ctx.telemetry.report_backlog.set(ctx.reports.pending)
    ctx.telemetry.history_samples.set(request.app.state.jobs.history_samples)
    ctx.telemetry.shards_held.set(request.app.state.jobs.shards_held)
    # The store collector reads the database during the scrape: off the event loop. A scrape during a database
    # outage still serves latency and report counters (the collector leaves its own families out).
    body = await run_in_threadpool(generate_latest, ctx.telemetry.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
