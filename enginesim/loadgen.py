"""A streaming load generator for vLLM-compatible servers (``pitstop sim load``).

``run_load`` keeps ``concurrency`` streaming chat requests in flight against the given URLs in round robin,
optionally paced to ``rate`` requests per second, until ``duration`` seconds or ``max_requests`` requests,
and measures what a client sees: time to first token and the gaps between tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

CHAT_TEMPLATE_TOKENS = 4
FAILURE_PAUSE_S = 0.05  # the simulator (and, roughly, real chat templates) add these per message


@dataclass(frozen=True)
class LoadSpec:
    """What load to generate."""

    urls: list[str]
    concurrency: int = 8
    duration: float = 10.0  # seconds; 0 = until stopped
    rate: float | None = None  # requests per second across all workers; None = as fast as streams finish
    prompt_tokens: int = 256
    max_tokens: int = 128
    model: str | None = None
    max_requests: int | None = None
    request_timeout: float = 120.0  # longest silence on one stream
    drain_grace: float = 10.0  # after ``duration``, how long in-flight streams may finish before cancelling


@dataclass
class RequestResult:
    ok: bool
    finished: bool = False  # False while streaming, and for streams cut off by the end of the run
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None
    # When it was sent and when it ended (time.monotonic()): which requests an episode's span touched.
    started: float | None = None
    ended: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summarize(results: list[RequestResult], elapsed: float) -> dict[str, Any]:
    """The JSON summary ``pitstop sim load`` prints."""
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in results if r.ttft is not None]
    itls = [g for r in results for g in r.itls]
    tokens = sum(r.tokens for r in results)

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000.0, 2)

    return {
        "requests_ok": len(ok),
        "requests_failed": sum(1 for r in results if r.finished and not r.ok),
        "requests_cut_off": sum(1 for r in results if not r.finished),
        "errors": dict(Counter(r.error for r in results if r.error)),
        "duration_s": round(elapsed, 3),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else 0.0,
        "ttft_ms_p50": ms(percentile(ttfts, 50)),
        "ttft_ms_p99": ms(percentile(ttfts, 99)),
        "itl_ms_p50": ms(percentile(itls, 50)),
        "itl_ms_p99": ms(percentile(itls, 99)),
    }


def prompt_text(request_number: int, prompt_tokens: int) -> str:
    """A unique prompt of about ``prompt_tokens`` tokens (at four characters a token, after the template)."""
    chars = max(1, prompt_tokens - CHAT_TEMPLATE_TOKENS) * 4
    head = f"request {request_number}: "
    filler = "lorem ipsum dolor sit amet " * (chars // 27 + 1)
    return (head + filler)[:chars]


async def stream_one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                     read_timeout: float, result: RequestResult | None = None) -> RequestResult:
    """One streaming chat request; TTFT and inter-token gaps measured on arrival of content chunks.

    ``result`` (if given) is filled in as chunks arrive, so a caller that cancels the stream keeps what came.
    """
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    result = result or RequestResult(ok=False)
    result.started = start
    last: float | None = None
    try:
        async with client.stream("POST", url.rstrip("/") + "/v1/chat/completions", json=body,
                                 timeout=read_timeout) as resp:
            if resp.status_code != 200:
                await resp.aread()
                result.error = f"http_{resp.status_code}"
                result.finished, result.ended = True, time.monotonic()
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    result.ok = True
                    break
                chunk = json.loads(data)
                choices = chunk.get("choices") or []
                if not choices or not choices[0].get("delta", {}).get("content"):
                    continue
                now = time.monotonic()
                if last is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
                result.tokens += 1
            if not result.ok:
                result.error = "stream_incomplete"
    except httpx.HTTPError as exc:
        result.error = type(exc).__name__
    # Not in a ``finally``: a stream cancelled at the end of the run did not finish.
    result.finished, result.ended = True, time.monotonic()
    return result


async def discover_model(client: httpx.AsyncClient, url: str) -> str:
    resp = await client.get(url.rstrip("/") + "/v1/models")
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


async def run_load(spec: LoadSpec, client: httpx.AsyncClient | None = None,
                   stop: asyncio.Event | None = None, results: list[RequestResult] | None = None) -> dict[str, Any]:
    """Generate ``spec``'s load and return the summary; ``stop`` ends it early. ``results``: a list the caller
    watches, each request appended as it starts (its ``finished`` set when it ends)."""
    own_client = client is None
    client = client or httpx.AsyncClient(limits=httpx.Limits(max_connections=spec.concurrency + 4))
    stop = stop or asyncio.Event()
    try:
        model = spec.model or await discover_model(client, spec.urls[0])
        results = [] if results is None else results
        counter = itertools.count()
        start = time.monotonic()
        deadline = start + spec.duration if spec.duration > 0 else math.inf

        async def worker() -> None:
            while not stop.is_set():
                n = next(counter)
                if spec.max_requests is not None and n >= spec.max_requests:
                    return
                if spec.rate:
                    delay = start + n / spec.rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                if time.monotonic() >= deadline or stop.is_set():
                    return
                url = spec.urls[n % len(spec.urls)]
                result = RequestResult(ok=False)
                results.append(result)
                await stream_one(client, url, model, prompt_text(n, spec.prompt_tokens), spec.max_tokens,
                                 spec.request_timeout, result)
                if not result.ok:
                    await asyncio.sleep(FAILURE_PAUSE_S)  # a failing server is not hammered in a tight loop

        workers = [asyncio.create_task(worker()) for _ in range(spec.concurrency)]
        stopper = asyncio.create_task(stop.wait())
        limit = spec.duration + spec.drain_grace if spec.duration > 0 else None
        # Streams cut off by the limit or a stop count their tokens but neither as ok nor as failed.
        gathered = asyncio.gather(*workers, return_exceptions=True)
        waited: list[asyncio.Future[Any]] = [gathered, stopper]
        await asyncio.wait(waited, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        for task in [*workers, stopper]:
            task.cancel()
        await asyncio.gather(gathered, stopper, return_exceptions=True)
        return summarize(results, time.monotonic() - start)
    finally:
        if own_client:
            await client.aclose()
