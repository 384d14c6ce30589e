"""The HTTP face of the simulator: vLLM's OpenAI-compatible routes, /health, /version and /metrics.

``create_app`` builds a Starlette app over one ``Engine``; everything it needs arrives in ``ServingContext``
(no globals), so tests can drive the app in-process and the server can flip ``draining`` on SIGTERM. Starlette,
not FastAPI (vLLM's): a simulator starts by the hundred in the tests and the benchmarks, and FastAPI's import
(its OpenAPI models) was more than half of each start's CPU. Unknown paths and methods answer FastAPI's JSON
``{"detail": ...}`` all the same.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from enginesim.dp import DataParallel
from enginesim.engine import Engine, EngineDeadError, EngineState, Failed, Finished, RequestHandle, Token
from enginesim.protocol import ApiError, GenerationRequest, ResponseWriter, parse_request

VLLM_VERSION = "0.33.0"


class StreamBrokenError(Exception):
    """The engine failed mid-stream: the connection is dropped without the terminating chunk."""


@dataclass
class ServingContext:
    """What the routes read: the engine, the served names, the registry and the fault knobs."""

    engine: Engine | DataParallel
    model: str
    served_names: list[str]
    max_model_len: int
    registry: CollectorRegistry
    error_rate: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    draining: bool = False
    started_at: int = field(default_factory=lambda: int(time.time()))


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _stream(ctx: ServingContext, req: GenerationRequest, handle: RequestHandle) -> AsyncIterator[bytes]:
    writer = ResponseWriter(req)
    engine = ctx.engine
    sent = 0
    try:
        event = await handle.events.get()
        while True:
            if isinstance(event, Failed):
                raise StreamBrokenError(event.message)
            if isinstance(event, Finished):
                yield _sse(writer.finish_chunk(event.reason))
                break
            # vLLM puts finish_reason on the last token's chunk: look at what is already queued behind it.
            following = None if handle.events.empty() else handle.events.get_nowait()
            finish = following.reason if isinstance(following, Finished) else None
            if sent == 0:
                if req.chat:
                    yield _sse(writer.role_chunk())
                # Recorded as the chunk is handed to the server, before the yield: a client that closes on the
                # finish_reason of a one-token answer would cancel the stream before the yield returns, and vLLM
                # records TTFT as it processes the engine's output, whatever the client does next.
                handle.first_token_sent(engine.clock.now())
            yield _sse(writer.token_chunk(event.index, finish))
            sent += 1
            if finish is not None:
                break
            event = following if following is not None else await handle.events.get()
        if req.include_usage:
            yield _sse(writer.usage_chunk(handle.seq.generated))
        yield b"data: [DONE]\n\n"
    finally:
        if not handle.done:
            engine.abort(handle)  # the client went away


def metrics_response(request: Request, registry: CollectorRegistry) -> Response:
    """``/metrics`` as both engines serve it, with prometheus_client: only the samples named by ``name[]`` when a
    scrape gives any (the agent's do)."""
    names = request.query_params.getlist("name[]")
    chosen = registry.restricted_registry(names) if names else registry
    return Response(generate_latest(chosen), media_type=CONTENT_TYPE_LATEST)


def openai_routes(ctx: ServingContext) -> list[Route]:
    """The OpenAI completion endpoints, which both engines serve alike here."""

    async def completions(request: Request) -> Response:
        return await generate(ctx, request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(ctx, request, chat=True)

    return [Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"])]


async def generate(ctx: ServingContext, request: Request, *, chat: bool) -> Response:
    """Answer one /v1/completions (``chat`` False) or /v1/chat/completions request."""
    arrival = ctx.engine.clock.now()
    try:
        body = await request.json()
    except ValueError as exc:
        return _error(ApiError(400, f"JSON decode error: {exc}"))
    if ctx.draining:
        # vLLM answers new work with 500 while it drains; /health stays 200 (see docs/design.md).
        return _error(ApiError(500, "The server is shutting down; request refused."))
    try:
        req = parse_request(body, chat=chat, served_names=ctx.served_names, max_model_len=ctx.max_model_len)
    except ApiError as exc:
        return _error(exc)
    if ctx.error_rate > 0 and ctx.rng.random() < ctx.error_rate:
        ctx.engine.metrics.error_answered()
        return _error(ApiError(500, "Internal server error (injected fault)."))
    try:
        handle = ctx.engine.submit(prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                                   ignore_eos=req.ignore_eos, prefixes=req.prefixes, arrival=arrival,
                                   stream=req.stream)
    except EngineDeadError as exc:
        return _error(ApiError(500, f"EngineCore encountered an issue: {exc}"))
    if req.stream:
        # Starlette sends the 200 headers at once and then waits on the stream; on a hung engine that is all
        # the client ever gets. It also cancels the stream when the client goes, which aborts the request.
        return StreamingResponse(_stream(ctx, req, handle), media_type="text/event-stream")
    # Like vLLM's ``with_cancellation``: a client that hangs up stops the wait, so a request queued on a hung
    # engine does not stay in flight for ever (vllm#39863).
    answer = asyncio.create_task(_answer(ctx, req, handle))
    gone = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        answer.cancel()
        await asyncio.gather(answer, gone, return_exceptions=True)
        if not handle.done:
            ctx.engine.abort(handle)  # the client went away
    if answer.cancelled():
        return Response(status_code=499)  # nobody is left to read it
    return answer.result()


async def _answer(ctx: ServingContext, req: GenerationRequest, handle: RequestHandle) -> Response:
    """Wait for the whole answer of a non-streaming request."""
    while True:
        event = await handle.events.get()
        if isinstance(event, Token):
            handle.first_token_sent(ctx.engine.clock.now())
        elif isinstance(event, Failed):
            return _error(ApiError(500, f"EngineCore encountered an issue: {event.message}"))
        else:
            return JSONResponse(ResponseWriter(req).full_response(handle.seq.generated, event.reason))


async def _disconnected(request: Request) -> None:
    """Return once the client has hung up: the body is read, so the next ASGI message says so."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(ctx: ServingContext) -> Starlette:
    """The app serving one engine."""

    async def health(_: Request) -> Response:
        return Response(status_code=503 if ctx.engine.state is EngineState.DEAD else 200)

    async def version(_: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    async def models(_: Request) -> Response:
        data = [{"id": name, "object": "model", "created": ctx.started_at, "owned_by": "vllm",
                 "root": ctx.model, "parent": None, "max_model_len": ctx.max_model_len,
                 "permission": [{"id": f"modelperm-{name}", "object": "model_permission",
                                 "created": ctx.started_at, "allow_create_engine": False,
                                 "allow_sampling": True, "allow_logprobs": True,
                                 "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                 "organization": "*", "group": None, "is_blocking": False}]}
                for name in ctx.served_names]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        return metrics_response(request, ctx.registry)

    routes = [Route("/health", health, methods=["GET"]), Route("/version", version, methods=["GET"]),
              Route("/v1/models", models, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
              *openai_routes(ctx)]
    return Starlette(routes=routes, exception_handlers={HTTPException: json_http_error})


async def json_http_error(_: Request, exc: Exception) -> Response:
    """FastAPI's answer to an unknown path or method: ``{"detail": ...}``."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


class DropBrokenStreams:
    """ASGI wrapper: a stream whose engine failed ends without its last chunk, as a dead vLLM's streams do."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except StreamBrokenError:
            return
