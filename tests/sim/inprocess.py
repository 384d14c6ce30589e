"""Run the simulator's app and engine inside the test's event loop (no subprocess, real clock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from enginesim.api import ServingContext, create_app
from enginesim.profiles import TINY_CPU
from enginesim.server import ServeConfig, build_engine


@dataclass
class InProcessSim:
    client: httpx.AsyncClient
    ctx: ServingContext
    app: ASGIApp  # for tests that must see ASGI messages httpx's transport buffers (headers before the body)


@asynccontextmanager
async def inprocess_sim(**overrides: object) -> AsyncIterator[InProcessSim]:
    config = ServeConfig(model="test-model", profile=TINY_CPU, **overrides)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    engine = build_engine(config, registry)
    ctx = ServingContext(engine=engine, model=config.model, served_names=config.names,
                         max_model_len=config.model_len, registry=registry)
    runner = asyncio.create_task(engine.run())
    app = create_app(ctx)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            yield InProcessSim(client=client, ctx=ctx, app=app)
    finally:
        engine.stop()
        await runner
