"""Run the simulator's app and engine inside the test's event loop (no subprocess; the real clock unless given)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from enginesim.api import ServingContext, create_app
from enginesim.clock import Clock
from enginesim.dp import DataParallel
from enginesim.profiles import TINY_CPU
from enginesim.server import ServeConfig, build_engine
from enginesim.sglang import SglangOptions
from enginesim.sglang_api import ServerStatus, SglangState
from enginesim.sglang_api import create_app as create_sglang_app
from enginesim.sglang_server import build_engine as build_sglang_engine


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


@dataclass
class InProcessSglang:
    client: httpx.AsyncClient
    ctx: ServingContext
    state: SglangState
    engine: DataParallel
    registry: CollectorRegistry


@asynccontextmanager
async def inprocess_sglang(options: SglangOptions | None = None, *, clock: Clock | None = None, up: bool = True,
                           **overrides: object) -> AsyncIterator[InProcessSglang]:
    """The SGLang face over tiny-cpu engines (page size 1, as SGLang's); ``up``: past its warm-up already."""
    options = options or SglangOptions(enable_metrics=True)
    settings: dict[str, object] = {"block_size": 1, "max_num_seqs": 2048, **overrides}
    config = ServeConfig(model="test-model", profile=TINY_CPU, sglang=options, **settings)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    metrics, engine = build_sglang_engine(config, registry, clock)
    state = SglangState(options=options, metrics=metrics, out=io.StringIO())
    if up:
        state.status = ServerStatus.UP
    ctx = ServingContext(engine=engine, model=config.model, served_names=config.names,
                         max_model_len=config.model_len, registry=registry)
    runner = asyncio.create_task(engine.run())
    transport = httpx.ASGITransport(app=create_sglang_app(ctx, state))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            yield InProcessSglang(client=client, ctx=ctx, state=state, engine=engine, registry=registry)
    finally:
        engine.stop()
        await runner
