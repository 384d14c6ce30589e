"""``create_app(config)``: the control plane's FastAPI app, with its own engine, registry, clock and scheduler."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from controlplane.api import (
    actions,
    admin,
    alertmanager,
    desired,
    fleet,
    health,
    prometheus_sd,
    remediation,
    reports,
    silences,
    summary,
    whoami,
)
from controlplane.api.auth import Authenticator
from controlplane.api.context import AppContext, Clock, utc_now
from controlplane.api.store_metrics import read_store
from controlplane.api.telemetry import Telemetry, TelemetryMiddleware
from controlplane.config import ServerConfig
from controlplane.fleet.writer import ReportWriter
from controlplane.heap import HeapFreezer
from controlplane.jobs import Jobs, PolicyHook
from controlplane.leader import Leadership, leadership_for
from controlplane.policy_process import PolicyProcess
from controlplane.remediation.finished import watch as watch_finished
from controlplane.store.db import make_engine, make_sessionmaker, migrate

log = logging.getLogger(__name__)

OPEN_MODE_WARNING = (
    "NO API TOKENS EXIST: the control plane is open, anyone who can reach it may write fleet state. "
    "Create one with 'pitstop server token create --role admin' (or set admin_tokens) to close it."
)


def create_app(config: ServerConfig, *, clock: Clock = utc_now, run_jobs: bool = True,
               leadership: Leadership | None = None, policy_hook: PolicyHook | None = None,
               heap: HeapFreezer | None = None, policy_process: bool = False, log_level: str = "info") -> FastAPI:
    """Build an app over ``config.database_url``, migrating the database to the latest revision first.

    ``run_jobs`` starts the scheduler (leader election, executor, retention, policy hook) with the app's
    lifespan; tests that drive the jobs by hand turn it off. ``heap``: the server process's garbage-collector
    tuning, after each policy round or, beside a policy process, every ``SETTLE_SECONDS`` (process-wide, so only
    ``pitstop server`` passes one). ``policy_process`` runs the policy rounds in a process of their own
    (``pitstop server`` does, unless configured off).
    """
    engine = make_engine(config.database_url)
    migrate(engine)
    sessions = make_sessionmaker(engine)
    telemetry = Telemetry()
    # pitstop_cp_actions_total: every final state this app's sessions commit.
    watch_finished(sessions, telemetry.count_finished)
    ctx = AppContext(
        config=config, engine=engine, sessions=sessions, clock=clock, telemetry=telemetry,
        auth=Authenticator(config, sessions, clock=clock),
        leadership=leadership if leadership is not None else leadership_for(config.database_url),
        reports=ReportWriter(sessions, clock, report_interval_seconds=config.report_interval_seconds,
                             max_pending=config.max_pending_reports, on_batch=telemetry.report_batch_size.observe,
                             max_clock_skew_seconds=config.max_clock_skew_seconds),
    )
    telemetry.serve_store(lambda: read_store(sessions, clock, ctx.stale_after))
    process = None
    if policy_process and config.policies_enabled:
        process = PolicyProcess(config, on_round=ctx.telemetry.policy_round,
                                on_finished=telemetry.count_finished, log_level=log_level)
    jobs = Jobs(sessions=sessions, leadership=ctx.leadership, config=config, clock=clock,
                on_leadership=lambda leads: ctx.telemetry.lead(leads, clock().timestamp()), policy_hook=policy_hook,
                on_round=ctx.telemetry.policy_round, heap=heap, policy_process=process,
                on_notified=lambda receiver, outcome, n: ctx.telemetry.notifications.labels(
                    receiver=receiver, outcome=outcome).inc(n))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if await run_in_threadpool(ctx.auth.open_mode):
            log.warning(OPEN_MODE_WARNING)
        if run_jobs:
            await run_in_threadpool(jobs.start)
        try:
            yield
        finally:
            if run_jobs:
                await run_in_threadpool(jobs.stop)
            await run_in_threadpool(ctx.reports.stop)
            engine.dispose()

    app = FastAPI(
        title="Pitstop control plane",
        summary="Fleet state for vLLM: agents report here and read back their desired state.",
        version="0.2.0",
        lifespan=lifespan,
    )
    app.state.pitstop = ctx
    app.state.jobs = jobs
    app.add_middleware(TelemetryMiddleware, telemetry=ctx.telemetry)
    for router in (reports.router, fleet.router, prometheus_sd.router, desired.router, actions.router, admin.router,
                   health.router, remediation.router, silences.router, alertmanager.router, summary.router,
                   whoami.router):
        app.include_router(router)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            app.openapi_schema = reports.register_schemas(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
