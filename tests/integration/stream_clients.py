"""Streaming clients in a process of their own: ``python -m tests.integration.stream_clients URL N TOKENS OUT``.

N completions of TOKENS tokens each, streamed at once from one event loop. Every 10 ms, and once all have
ended, OUT is replaced with what each stream has received: ``{"streams": [{"arrivals": [...], "counts": [...],
"done": bool, "error": str | null}], "last": moment of the latest chunk, "ended": bool}``. Moments are
``time.monotonic()``, which on Linux is the same clock in every process.

A process of its own, because a client sharing pytest's interpreter with a stand-in control plane reads its
sockets late (the GIL): it would then see an engine's tokens long after they were made.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import httpx


async def _one(client: httpx.AsyncClient, url: str, tokens: int, stream: dict[str, Any]) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": tokens, "stream": True, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            pending = b""  # lines split on b"\n" only: the text may hold characters str.splitlines() breaks on
            async for data in response.aiter_bytes():
                *lines, pending = (pending + data).split(b"\n")
                for line in (raw.strip() for raw in lines):
                    if line == b"data: [DONE]":
                        stream["done"] = True
                    elif line.startswith(b"data:"):
                        chunk = json.loads(line[5:])
                        if chunk.get("choices") and chunk.get("usage"):
                            stream["arrivals"].append(time.monotonic())
                            stream["counts"].append(int(chunk["usage"]["completion_tokens"]))
    except (httpx.HTTPError, ValueError) as exc:
        stream["error"] = f"{type(exc).__name__}: {exc}"


def _write(out: str, streams: list[dict[str, Any]], ended: bool) -> None:
    last = max((s["arrivals"][-1] for s in streams if s["arrivals"]), default=0.0)
    with open(f"{out}.tmp", "w") as f:
        json.dump({"streams": streams, "last": last, "ended": ended}, f)
    os.replace(f"{out}.tmp", out)


async def main(url: str, n: int, tokens: int, out: str) -> None:
    streams: list[dict[str, Any]] = [{"arrivals": [], "counts": [], "done": False, "error": None} for _ in range(n)]
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        tasks = [asyncio.create_task(_one(client, url, tokens, s)) for s in streams]
        while not all(t.done() for t in tasks):
            _write(out, streams, ended=False)
            await asyncio.sleep(0.01)
    _write(out, streams, ended=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
