"""The HTTP face of the SGLang personality: the OpenAI routes the vLLM face serves, and SGLang's own.

``/health`` and ``/health_generate`` are one handler, as in SGLang: on an idle server it queues a one-token
generation (counted in no metric; a busy scheduler skips it, its batches' output answering for it) and polls once
a second, for up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds, for any output of the scheduler since it began, not
necessarily its own. 200 then; 503 while the server starts (until its warm-up request finished), once it is
shutting down, and when nothing came, which also marks the server unhealthy (a SIGTERM then exits at once). So a
hung engine fails it after the timeout, and so would a prefill that long (sglang#22511); a dead scheduler is
never probed here, since it takes its server with it. ``/metrics`` exists only with ``--enable-metrics``, and
then every request is counted by route, method and status, as SGLang's middleware counts them.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import TextIO

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from enginesim.api import ServingContext, json_http_error, metrics_response, openai_routes
from enginesim.engine import EngineDeadError
from enginesim.exposition import exposition_registry
from enginesim.server import log
from enginesim.sglang import HEALTH_POLL_S, SglangOptions
from enginesim.sglang_metrics import SglangMetrics


class ServerStatus(enum.StrEnum):
    """SGLang's server status, as /health reads it."""

    STARTING = "Starting"  # until the warm-up request finished
    UP = "Up"
    UNHEALTHY = "UnHealthy"  # the last health check got no output in time


@dataclass
class SglangState:
    """What SGLang's routes read beyond the shared ``ServingContext``."""

    options: SglangOptions
    metrics: SglangMetrics
    out: TextIO
    status: ServerStatus = ServerStatus.STARTING
    shutting_down: bool = False  # SIGTERM received: draining
    exposition: CollectorRegistry = field(init=False)

    def __post_init__(self) -> None:
        self.exposition = exposition_registry(self.metrics.registry)


async def _health(ctx: ServingContext, state: SglangState) -> Response:
    if state.shutting_down:
        log(state.out, "Health check during shutdown: 503")
        return Response(status_code=503)
    if state.status is ServerStatus.STARTING:
        return Response(status_code=503)
    engine = ctx.engine
    clock = engine.clock
    try:
        probe = None if engine.has_work() else engine.submit(prompt_tokens=1, max_tokens=1, ignore_eos=True,
                                                             log_metrics=False)
    except EngineDeadError:
        return Response(status_code=503)
    tic = clock.now()
    try:
        while clock.now() < tic + state.options.health_timeout:
            await asyncio.sleep(HEALTH_POLL_S)
            last = engine.last_output
            if last is not None and last > tic:
                state.status = ServerStatus.UP
                return Response(status_code=200)
    finally:
        if probe is not None:
            engine.abort(probe)
    log(state.out, f"Health check failed: no output from the scheduler in {state.options.health_timeout:g} s")
    state.status = ServerStatus.UNHEALTHY
    return Response(status_code=503)


def create_app(ctx: ServingContext, state: SglangState) -> ASGIApp:
    """The app serving one SGLang face over ``ctx.engine``."""
    name = ctx.served_names[0]

    async def health(_: Request) -> Response:
        return await _health(ctx, state)

    async def ready(_: Request) -> Response:
        up = state.status is ServerStatus.UP and not state.shutting_down
        return Response(status_code=200 if up else 503)

    async def model_info(_: Request) -> Response:
        return JSONResponse({
            "model_path": ctx.model, "served_model_name": name, "tokenizer_path": ctx.model, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "load_format": "auto",
            "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False, "model_type": None,
            "architectures": None})

    async def models(_: Request) -> Response:
        card = {"id": name, "object": "model", "created": ctx.started_at, "owned_by": "sglang", "root": name,
                "parent": None, "max_model_len": ctx.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(request: Request) -> Response:
        return metrics_response(request, state.exposition)
    routes = [Route("/health", health, methods=["GET"]), Route("/health_generate", health, methods=["GET"]),
              Route("/ready", ready, methods=["GET"]), Route("/get_model_info", model_info, methods=["GET"]),
              Route("/model_info", model_info, methods=["GET"]), Route("/v1/models", models, methods=["GET"]),
              *openai_routes(ctx)]
    if state.options.enable_metrics:
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    app = Starlette(routes=routes, exception_handlers={HTTPException: json_http_error})
    return CountRequests(app, state.metrics) if state.options.enable_metrics else app


class CountRequests:
    """ASGI middleware: each request by route (the raw path when none matches), method and status."""

    def __init__(self, app: Starlette, metrics: SglangMetrics) -> None:
        self.app = app
        self.metrics = metrics

    def _endpoint(self, scope: Scope) -> str:
        for route in self.app.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return str(getattr(route, "path", scope["path"]))
        return str(scope["path"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint, method = self._endpoint(scope), scope["method"]
        status = 500  # what the middleware records when the app fails without answering
        self.metrics.http_started(endpoint, method)

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.http_ended(endpoint, method, status)
