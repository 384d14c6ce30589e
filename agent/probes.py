"""Requests the agent makes to an engine: readiness, warmup/canary completions, and in-flight work.

The paths are the engine adapter's (``engines/``). The health path alone is not readiness: vLLM's answers 200
before the model is served and even on a wedged EngineCore (vLLM #39863), SGLang's while its scheduler is dead
(sglang#6624), so STARTING ends only when the models path lists the model too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from agent.engine_metrics import MetricsParseError, parse_metrics
from agent.http1 import Exchange
from agent.lean_client import lean_transport
from agent.plain_http import STREAM, BodyTooLarge, PlainHttpTransport, prepare, read_capped
from agent.ticks import until_tick
from engines import DEFAULT_ADAPTER, EngineAdapter, Probes


def served_model_name(model: str, args: list[str], flag: str = DEFAULT_ADAPTER.served_name_flag) -> str:
    """The name the engine lists in /v1/models: the served-name ``flag``'s first value if given, else the model."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return model


async def engine_ready(client: httpx.AsyncClient, base_url: str, model: str, request_timeout: float,
                       probes: Probes = DEFAULT_ADAPTER.probes) -> bool:
    """The health path is 200 and the models path lists ``model`` (any model when ``model`` is empty)."""
    try:
        health = await client.get(f"{base_url}{probes.health}", timeout=request_timeout)
        if health.status_code != 200:
            return False
        models = await client.get(f"{base_url}{probes.models}", timeout=request_timeout)
        if models.status_code != 200:
            return False
        ids = [m.get("id") for m in models.json().get("data", []) if isinstance(m, dict)]
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
    return bool(ids) and (not model or model in ids)


async def engine_alive(client: httpx.AsyncClient, base_url: str, request_timeout: float,
                       probes: Probes = DEFAULT_ADAPTER.probes) -> bool:
    """The engine answers its liveness path (one that costs it no generation)."""
    try:
        return (await client.get(f"{base_url}{probes.liveness}", timeout=request_timeout)).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class CompletionResult:
    ok: bool
    ttft_seconds: float | None = None
    error: str | None = None
    # The caller hung up at its deadline on a request it had sent: vLLM counts it as finished_reason "abort".
    cut: bool = False


def completion_request(client: httpx.AsyncClient, base_url: str, model: str, prompt: str, max_tokens: int,
                       request_timeout: float) -> httpx.Request:
    """The streaming completion ``stream_completion`` sends; the same bytes every time, so a caller that sends it
    every interval (the canary) builds it once."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    # STREAM: on the agent's lean transport the chunks are handed on as they arrive, so TTFT is the first one.
    return client.build_request("POST", f"{base_url}/v1/completions", json=body, timeout=request_timeout,
                                extensions={STREAM: True})


class _Events:
    """A canary's server-sent events, fed as they arrive: TTFT at the first data event, the outcome once ``[DONE]``
    (or an error) is read. Kept apart from how the bytes come, so both transports' paths read them alike."""

    def __init__(self, clock: Callable[[], float], started: float) -> None:
        self.clock, self.started = clock, started
        self.pending = b""
        self.ttft: float | None = None
        self.result: CompletionResult | None = None

    def feed(self, part: bytes) -> bool:
        """Take ``part`` of the body; True once the outcome is known."""
        if self.result is not None:
            return True
        self.pending += part
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.result = CompletionResult(True, self.ttft)
                return True
            if self.ttft is None:
                try:
                    chunk = json.loads(payload)
                except ValueError as exc:
                    self.result = CompletionResult(False, None, f"{type(exc).__name__}: {exc}"[:300])
                    return True
                if isinstance(chunk, dict) and "error" in chunk:
                    self.result = CompletionResult(False, None, str(chunk["error"])[:200])
                    return True
                self.ttft = self.clock() - self.started
        return False

    def ended(self) -> CompletionResult:
        """The outcome once the body ended."""
        if self.result is None and self.pending.rstrip(b"\r").strip() == b"data: [DONE]":
            self.result = CompletionResult(True, self.ttft)
        return self.result or CompletionResult(False, self.ttft, "stream ended without [DONE]")


def _gather_until(seconds: float) -> float:
    """Where a gather of ``seconds`` after now ends: from ``seconds`` up to twice that, on their ticks
    (``agent.ticks``): the canaries of one round, whose first tokens come within a few milliseconds of each other,
    read the rest of their answers in one wakeup."""
    now = asyncio.get_running_loop().time()
    return now + seconds + until_tick(now + seconds, seconds)


async def _on_lean(lean: PlainHttpTransport, request: httpx.Request, events: _Events,
                   gather_seconds: float) -> CompletionResult:
    """The canary on the agent's lean transport: its events read in the connection's callback as they arrive, the
    canary's task woken once, at the end (it runs every interval on every replica: each read through asyncio's
    streams was a step of this task)."""
    refused: list[bytes] = []

    def on_part(part: bytes, exchange: Exchange) -> None:
        if exchange.head is not None and exchange.head.status != 200:
            refused.append(part)
            return
        measured = events.ttft is not None
        if events.feed(part):
            exchange.finish()
        elif not measured and events.ttft is not None and gather_seconds > 0:
            # TTFT is measured; the rest is only waited for: its events read together, not each as it comes.
            exchange.hold(_gather_until(gather_seconds))

    head = await lean.read(prepare(request), on_part)
    if head.status != 200:
        said = b"".join(refused)[:200].decode("utf-8", "replace")
        return CompletionResult(False, error=f"HTTP {head.status}: {said}")
    return events.ended()


async def _on_client(client: httpx.AsyncClient, request: httpx.Request, events: _Events) -> CompletionResult:
    """The canary through ``client``'s own transport (``https://``, or a client that is not the agent's)."""
    response = await client.send(request, stream=True)
    try:
        if response.status_code != 200:
            said = (await response.aread()).decode("utf-8", "replace")
            return CompletionResult(False, error=f"HTTP {response.status_code}: {said[:200]}")
        async for part in response.aiter_bytes():
            if events.feed(part):
                break
        return events.ended()
    finally:
        await response.aclose()


async def stream_completion(client: httpx.AsyncClient, base_url: str, model: str, prompt: str, max_tokens: int,
                            request_timeout: float, clock: Callable[[], float], *,
                            request: httpx.Request | None = None, gather_seconds: float = 0.0) -> CompletionResult:
    """One streaming completion with a deadline for the whole of it; TTFT is the time to the first data chunk.
    ``request``: the one ``completion_request`` built for these arguments, when the caller keeps it.
    ``gather_seconds``: after the first token, how long the rest may collect before it is read (0: as it comes;
    on the agent's lean transport only).

    The deadline covers the request end to end, not each read: a wedged vLLM accepts the request and then
    sends nothing (vLLM #39863), and a per-read timeout alone would also let a trickle of bytes run forever."""
    if request is None:
        request = completion_request(client, base_url, model, prompt, max_tokens, request_timeout)
    events = _Events(clock, clock())
    lean = lean_transport(client, str(request.url))
    try:
        async with asyncio.timeout(request_timeout):
            if lean is not None:
                return await _on_lean(lean, request, events, gather_seconds)
            return await _on_client(client, request, events)
    except TimeoutError:
        return CompletionResult(False, events.ttft, f"no completion within {request_timeout:g}s", cut=True)
    except (httpx.HTTPError, ValueError) as exc:
        return CompletionResult(False, events.ttft, f"{type(exc).__name__}: {exc}"[:300])


async def _engine_values(client: httpx.AsyncClient, metrics_url: str, model: str, request_timeout: float,
                         engine: EngineAdapter) -> dict[str, float] | None:
    """The engine's /metrics as the table's values (``agent.engine_metrics``); None when it cannot be read (a body
    past the scrapes' 16 MiB included: read with the same cap, whichever client reads it)."""
    try:
        async with client.stream("GET", metrics_url, timeout=request_timeout) as response:
            response.raise_for_status()
            body = await read_capped(response)
        return parse_metrics(body.decode(response.encoding or "utf-8", "replace"), 0.0, model or None, engine).values
    except (httpx.HTTPError, MetricsParseError, BodyTooLarge):
        return None


async def generation_tokens(client: httpx.AsyncClient, metrics_url: str, model: str, request_timeout: float,
                            engine: EngineAdapter = DEFAULT_ADAPTER) -> float | None:
    """The engine's generated-tokens counter now (vLLM's ``vllm:generation_tokens_total``); ``None`` when /metrics
    cannot be read or lacks it."""
    values = await _engine_values(client, metrics_url, model, request_timeout, engine)
    return None if values is None else values.get("generation_tokens")


async def in_flight(client: httpx.AsyncClient, base_url: str, model: str, request_timeout: float,
                    engine: EngineAdapter = DEFAULT_ADAPTER) -> float | None:
    """Requests running plus waiting, from the engine's /metrics; ``None`` when it cannot be read."""
    values = await _engine_values(client, f"{base_url}{engine.probes.metrics}", model, request_timeout, engine)
    if values is None or ("running" not in values and "waiting" not in values):
        return None
    return values.get("running", 0.0) + values.get("waiting", 0.0)
