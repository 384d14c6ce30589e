"""Requests the agent makes to an engine: readiness, warmup/canary completions, and in-flight work.

``/health`` alone is not readiness: it answers 200 before the model is served and even on a wedged
EngineCore (vLLM #39863), so STARTING ends only when ``/v1/models`` lists the model too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from dataclasses import dataclass

import httpx

from agent.engine_metrics import MetricsParseError, parse_metrics
from agent.lean_client import lean_transport
from agent.plain_http import STREAM, BodyTooLarge, prepare, read_capped


def served_model_name(model: str, args: list[str]) -> str:
    """The name the engine lists in /v1/models: ``--served-model-name`` if given, else the model."""
    for i, arg in enumerate(args):
        if arg == "--served-model-name" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--served-model-name="):
            return arg.split("=", 1)[1]
    return model


async def engine_ready(client: httpx.AsyncClient, base_url: str, model: str, request_timeout: float) -> bool:
    """``/health`` is 200 and ``/v1/models`` lists ``model`` (any model when ``model`` is empty)."""
    try:
        health = await client.get(f"{base_url}/health", timeout=request_timeout)
        if health.status_code != 200:
            return False
        models = await client.get(f"{base_url}/v1/models", timeout=request_timeout)
        if models.status_code != 200:
            return False
        ids = [m.get("id") for m in models.json().get("data", []) if isinstance(m, dict)]
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
    return bool(ids) and (not model or model in ids)


async def engine_alive(client: httpx.AsyncClient, base_url: str, request_timeout: float) -> bool:
    try:
        return (await client.get(f"{base_url}/health", timeout=request_timeout)).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class CompletionResult:
    ok: bool
    ttft_seconds: float | None = None
    error: str | None = None


def completion_request(client: httpx.AsyncClient, base_url: str, model: str, prompt: str, max_tokens: int,
                       request_timeout: float) -> httpx.Request:
    """The streaming completion ``stream_completion`` sends; the same bytes every time, so a caller that sends it
    every interval (the canary) builds it once."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    # STREAM: on the agent's lean transport the chunks are handed on as they arrive, so TTFT is the first one.
    return client.build_request("POST", f"{base_url}/v1/completions", json=body, timeout=request_timeout,
                                extensions={STREAM: True})


async def _sse_lines(parts: AsyncIterable[bytes]) -> AsyncGenerator[bytes, None]:
    """The lines of a server-sent event stream as bytes (no text decoding: only ``data:`` lines are read)."""
    pending = b""
    async for chunk in parts:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r")
    if pending:
        yield pending.rstrip(b"\r")


@dataclass(frozen=True)
class _Opened:
    status: int
    parts: AsyncIterable[bytes]
    close: Callable[[], Awaitable[None]]
    # Lets the rest of the body collect before it is read (``_StreamedBody.gather``); None: read as it arrives.
    gather: Callable[[float], Awaitable[None]] | None = None


async def _open_stream(client: httpx.AsyncClient, request: httpx.Request) -> _Opened:
    """The status, the body as it arrives and what closes it: on the agent's lean transport directly (the canary
    runs every interval on every replica: httpx's layers around the transport were a fifth of it), else through
    ``client``."""
    lean = lean_transport(client, str(request.url))
    if lean is not None:
        status, body = await lean.stream(prepare(request))
        return _Opened(status, body, body.aclose, body.gather)
    response = await client.send(request, stream=True)
    return _Opened(response.status_code, response.aiter_bytes(), response.aclose)


async def stream_completion(client: httpx.AsyncClient, base_url: str, model: str, prompt: str, max_tokens: int,
                            request_timeout: float, clock: Callable[[], float], *,
                            request: httpx.Request | None = None, gather_seconds: float = 0.0) -> CompletionResult:
    """One streaming completion with a deadline for the whole of it; TTFT is the time to the first data chunk.
    ``request``: the one ``completion_request`` built for these arguments, when the caller keeps it.
    ``gather_seconds``: after the first token, how long the rest may collect before it is read (0: as it comes).

    The deadline covers the request end to end, not each read: a wedged vLLM accepts the request and then
    sends nothing (vLLM #39863), and a per-read timeout alone would also let a trickle of bytes run forever."""
    if request is None:
        request = completion_request(client, base_url, model, prompt, max_tokens, request_timeout)
    started = clock()
    ttft = None
    opened: _Opened | None = None
    try:
        async with asyncio.timeout(request_timeout):
            opened = await _open_stream(client, request)
            if opened.status != 200:
                said = b"".join([part async for part in opened.parts]).decode("utf-8", "replace")
                return CompletionResult(False, error=f"HTTP {opened.status}: {said[:200]}")
            async with contextlib.aclosing(_sse_lines(opened.parts)) as lines:
                async for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        return CompletionResult(True, ttft)
                    if ttft is None:
                        chunk = json.loads(payload)
                        if "error" in chunk:
                            return CompletionResult(False, None, str(chunk["error"])[:200])
                        ttft = clock() - started
                        if opened.gather is not None and gather_seconds > 0:
                            # TTFT is measured; the rest is only waited for: its events read together, not
                            # each as it comes (a few loop wakeups fewer per canary).
                            await opened.gather(gather_seconds)
    except TimeoutError:
        return CompletionResult(False, ttft, f"no completion within {request_timeout:g}s")
    except (httpx.HTTPError, ValueError) as exc:
        return CompletionResult(False, ttft, f"{type(exc).__name__}: {exc}"[:300])
    finally:
        if opened is not None:
            await opened.close()
    return CompletionResult(False, ttft, "stream ended without [DONE]")


async def _engine_values(client: httpx.AsyncClient, metrics_url: str, model: str,
                         request_timeout: float) -> dict[str, float] | None:
    """The engine's /metrics as the table's values (``agent.engine_metrics``); None when it cannot be read (a body
    past the scrapes' 16 MiB included: read with the same cap, whichever client reads it)."""
    try:
        async with client.stream("GET", metrics_url, timeout=request_timeout) as response:
            response.raise_for_status()
            body = await read_capped(response)
        return parse_metrics(body.decode(response.encoding or "utf-8", "replace"), 0.0, model or None).values
    except (httpx.HTTPError, MetricsParseError, BodyTooLarge):
        return None


async def generation_tokens(client: httpx.AsyncClient, metrics_url: str, model: str,
                            request_timeout: float) -> float | None:
    """The engine's ``vllm:generation_tokens_total`` now; ``None`` when /metrics cannot be read or lacks it."""
    values = await _engine_values(client, metrics_url, model, request_timeout)
    return None if values is None else values.get("generation_tokens")


async def in_flight(client: httpx.AsyncClient, base_url: str, model: str, request_timeout: float) -> float | None:
    """Requests running plus waiting, from the engine's /metrics; ``None`` when it cannot be read."""
    values = await _engine_values(client, f"{base_url}/metrics", model, request_timeout)
    if values is None or ("running" not in values and "waiting" not in values):
        return None
    return values.get("running", 0.0) + values.get("waiting", 0.0)
