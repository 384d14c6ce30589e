"""A hung engine in-process (vllm#39863): the API keeps answering, nothing published moves, nobody is answered."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp, Message

from enginesim.engine import EngineState, Token
from enginesim.faults import HangGauges
from tests.sim.inprocess import InProcessSim, inprocess_sim

LABELS = {"model_name": "test-model", "engine": "0"}
QUIET_S = 0.3  # how long "never answered" is watched: dozens of tiny-cpu steps, far more than one token needs
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def key(name: str, **labels: str) -> SeriesKey:
    return name, tuple(sorted({**LABELS, **labels}.items()))


async def vllm_series(sim: InProcessSim) -> dict[SeriesKey, float]:
    """Every ``vllm:`` sample of one /metrics scrape, by name and labels."""
    response = await sim.client.get("/metrics")
    assert response.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples
            if s.name.startswith("vllm:")}


@dataclass
class AsgiCall:
    """One request driven straight into the app, so the test sees each ASGI message and can hang up."""

    sent: asyncio.Queue[Message] = field(default_factory=asyncio.Queue)
    hang_up: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def close(self) -> list[Message]:
        """Hang up, wait for the app to let go of the request, and return what it sent meanwhile."""
        self.hang_up.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 2)
        return [self.sent.get_nowait() for _ in range(self.sent.qsize())]


def start_call(app: ASGIApp, path: str, body: dict[str, Any]) -> AsgiCall:
    call = AsgiCall()
    # spec_version 2.3 as uvicorn's HTTP protocols declare it: Starlette then watches for the disconnect.
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"sim"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 40000), "server": ("sim", 80)}
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await call.hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await call.sent.put(message)

    async def run() -> None:
        await app(scope, receive, send)

    call.task = asyncio.create_task(run())
    return call


CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
        "ignore_eos": True}
COMPLETION = {"model": "test-model", "prompt": "hi", "max_tokens": 20, "ignore_eos": True}


@pytest.mark.parametrize("variant", ["zero", "last"])
def test_hung_engine_answers_health_and_metrics_but_nothing_moves(variant: HangGauges) -> None:
    async def go() -> None:
        async with inprocess_sim(max_num_seqs=1) as sim:
            engine = sim.ctx.engine
            # One request decoding and one queued behind it (max_num_seqs 1): both gauges read 1 at the hang.
            first = engine.submit(prompt_tokens=8, max_tokens=1000, ignore_eos=True)
            engine.submit(prompt_tokens=8, max_tokens=1000, ignore_eos=True)
            assert isinstance(await asyncio.wait_for(first.events.get(), 5), Token)
            engine.hang(variant)
            assert engine.state is EngineState.HUNG
            at_hang = await vllm_series(sim)
            held = 0.0 if variant == "zero" else 1.0
            assert at_hang[key("vllm:num_requests_running")] == held
            assert at_hang[key("vllm:num_requests_waiting")] == held
            assert at_hang[key("vllm:num_requests_waiting_by_reason", reason="capacity")] == held
            assert at_hang[key("vllm:num_requests_waiting_by_reason", reason="deferred")] == 0
            assert at_hang[key("vllm:kv_cache_usage_perc")] > 0  # kept in both variants
            tokens = at_hang[key("vllm:generation_tokens_total")]
            assert tokens >= 1

            # New work during the hang: accepted, never answered. A stream gets its 200 headers, then nothing.
            stream = start_call(sim.app, "/v1/chat/completions", {**CHAT, "stream": True})
            start = await asyncio.wait_for(stream.sent.get(), 2)
            assert start["type"] == "http.response.start" and start["status"] == 200
            plain = start_call(sim.app, "/v1/completions", COMPLETION)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(stream.sent.get(), QUIET_S)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(plain.sent.get(), 0.01)  # the stream's wait above gave it QUIET_S too
            with pytest.raises(TimeoutError):  # a client with a short timeout gives up
                await asyncio.wait_for(sim.client.post("/v1/completions", json=COMPLETION), QUIET_S)
            sim.ctx.error_rate = 1.0  # the API's own 500s count nothing either
            assert (await sim.client.post("/v1/completions", json=COMPLETION)).status_code == 500
            sim.ctx.error_rate = 0.0
            assert (await sim.client.get("/health")).status_code == 200
            assert engine.in_flight == 4  # the two from before the hang and the two open calls

            during = await vllm_series(sim)
            assert during[key("vllm:generation_tokens_total")] == tokens
            assert during == at_hang  # no gauge, counter or histogram moved for four new requests

            # Clients that hang up are forgotten inside (nothing leaks) without moving any published series.
            assert not any(m.get("body") for m in await stream.close())
            await plain.close()
            assert engine.in_flight == 2
            assert await vllm_series(sim) == at_hang
            assert (await sim.client.get("/health")).status_code == 200
    asyncio.run(go())


def test_a_disconnected_plain_request_is_aborted_on_a_running_engine_too() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            # The app reads the body before it sees the hang-up, so the request is submitted, then aborted.
            call = start_call(sim.app, "/v1/completions", {**COMPLETION, "max_tokens": 1000})
            sent = await call.close()
            assert all(m.get("status") != 200 for m in sent)
            assert sim.ctx.engine.in_flight == 0
            series = await vllm_series(sim)
            assert series[key("vllm:request_success_total", finished_reason="abort")] == 1
    asyncio.run(go())
