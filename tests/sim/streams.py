"""A small streaming client for the process tests: what arrived, and when."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class StreamRecord:
    chunks: list[dict[str, Any]] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    status: int = 0
    started: float = 0.0

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.started


def stream_chat(url: str, max_tokens: int, *, timeout: float = 30.0, ignore_eos: bool = True,
                client: httpx.Client | None = None, **extra: Any) -> StreamRecord:
    body = {"model": "test-model", "messages": [{"role": "user", "content": "tell me a story"}],
            "max_tokens": max_tokens, "stream": True, "ignore_eos": ignore_eos, **extra}
    http = client or httpx.Client()
    rec = StreamRecord(started=time.monotonic())
    try:
        with http.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout) as resp:
            rec.status = resp.status_code
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    rec.done = True
                    break
                chunk = json.loads(line[6:])
                rec.chunks.append(chunk)
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    rec.token_times.append(time.monotonic())
    except httpx.HTTPError as exc:
        rec.error = type(exc).__name__
    finally:
        if client is None:
            http.close()
    return rec
