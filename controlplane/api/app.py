"""``create_app(config)``: the control plane's FastAPI app, with its own engine, registry and clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from controlplane.api import desired, fleet, health, reports
from controlplane.api.auth import TokenCheck
from controlplane.api.context import AppContext, Clock, utc_now
from controlplane.api.telemetry import Telemetry
from controlplane.config import ServerConfig
from controlplane.retention import RetentionLoop
from controlplane.store.db import make_engine, make_sessionmaker, migrate


def create_app(config: ServerConfig, *, clock: Clock = utc_now, run_retention: bool = True) -> FastAPI:
    """Build an app over ``config.database_url``, migrating the database to the latest revision first."""
    engine = make_engine(config.database_url)
    migrate(engine)
    ctx = AppContext(
        config=config,
        engine=engine,
        sessions=make_sessionmaker(engine),
        clock=clock,
        telemetry=Telemetry(),
        agent_auth=TokenCheck(config.agent_tokens, "agent"),
        read_auth=TokenCheck([*config.operator_tokens, *config.viewer_tokens], "viewer"),
        # Writes are open only in a token-free setup; once any token is configured they need an operator's.
        operator_auth=TokenCheck(config.operator_tokens, "operator",
                                 closed_when_empty=bool(config.agent_tokens or config.viewer_tokens)),
    )
    retention = RetentionLoop(ctx.sessions, clock=clock, config=config) if run_retention else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if retention is not None:
            retention.start()
        try:
            yield
        finally:
            if retention is not None:
                await retention.stop()
            engine.dispose()

    app = FastAPI(
        title="Pitstop control plane",
        summary="Fleet state for vLLM: agents report here and read back their desired state.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.pitstop = ctx
    app.middleware("http")(ctx.telemetry.middleware)
    app.include_router(reports.router)
    app.include_router(fleet.router)
    app.include_router(desired.router)
    app.include_router(health.router)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            app.openapi_schema = reports.register_schemas(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
