"""The agent's pass-through of an engine's /metrics: the body as the engine sent it, or a reason, never a hang."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from agent.api import create_app
from agent.engine_proxy import Proxied, fetch_engine_metrics, scrape_timeout
from agent.lean_client import scrape_client
from agent.wire import ReplicaState, ReplicaStatus
from tests.helpers import free_port, wait_until

VLLM = (Path(__file__).parent / "fixtures" / "vllm-0.33-metrics.txt").read_bytes()
TEXT = "text/plain; version=0.0.4; charset=utf-8"


class OneReplica:
    node = "n1"
    registry = CollectorRegistry()

    def statuses(self) -> list[ReplicaStatus]:
        return [ReplicaStatus(name="r0", model="m", url="http://127.0.0.1:8001", state=ReplicaState.READY,
                              ready=True, state_since=datetime(2026, 1, 1, tzinfo=UTC))]

    def status_of(self, name: str) -> ReplicaStatus | None:
        return next((s for s in self.statuses() if s.name == name), None)


def _client(handler: httpx.MockTransport) -> TestClient:
    return TestClient(create_app(OneReplica(), engine_client=httpx.AsyncClient(transport=handler)))


def test_the_engines_text_passes_through_unchanged_with_its_content_type_and_the_scrapers_accept() -> None:
    seen: list[httpx.Request] = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=VLLM, headers={"content-type": TEXT})

    answer = _client(httpx.MockTransport(engine)).get(
        "/engines/r0/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0",
                                        "Authorization": "Bearer not-for-the-engine"})
    assert answer.status_code == 200 and answer.content == VLLM
    assert answer.headers["content-type"] == TEXT
    assert str(seen[0].url) == "http://127.0.0.1:8001/metrics"
    assert seen[0].headers["accept"].startswith("application/openmetrics-text")
    assert "authorization" not in seen[0].headers  # the scraper's credentials are for the agent only


def test_on_the_agents_own_client_the_pass_through_shares_the_scrapes_kept_connection() -> None:
    app = FastAPI()
    accepts: list[str] = []

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        accepts.append(request.headers.get("accept", ""))
        return Response(VLLM, media_type=TEXT)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, what="engine stand-in")

    async def run() -> tuple[list[Proxied], int]:
        async with scrape_client() as client:
            got = [await fetch_engine_metrics(client, f"http://127.0.0.1:{port}", {"Accept": accept}, 5.0)
                   for accept in ("application/openmetrics-text;version=1.0.0", "text/plain")]
            return got, client.plain.connections_opened

    try:
        proxied, opened = asyncio.run(run())
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert [(p.status, p.body, p.content_type) for p in proxied] == [(200, VLLM, TEXT)] * 2
    assert accepts == ["application/openmetrics-text;version=1.0.0", "text/plain"]
    assert opened == 1


def test_an_engine_that_does_not_answer_is_a_503_naming_it_and_an_unknown_replica_a_404() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = _client(httpx.MockTransport(refused))
    down = client.get("/engines/r0/metrics")
    assert down.status_code == 503 and "http://127.0.0.1:8001 unreachable: ConnectError" in down.text
    assert client.get("/engines/nope/metrics").status_code == 404


def test_an_endless_body_is_cut_at_the_cap_and_refused_without_being_buffered_whole() -> None:
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        line = b'vllm:num_requests_running{model_name="m"} 1.0\n' * 1000
        while True:
            sent += len(line)
            yield line

    def engine(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless(), headers={"content-type": TEXT})

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            proxied = await fetch_engine_metrics(client, "http://e", {}, 5.0, max_bytes=1_000_000)
        assert proxied.status == 502 and b"over 1000000 bytes" in proxied.body
        assert sent < 1_100_000

    asyncio.run(run())


def test_a_declared_length_over_the_cap_is_refused_before_reading() -> None:
    def engine(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"x" * 2000, headers={"content-type": TEXT})

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            proxied = await fetch_engine_metrics(client, "http://e", {}, 5.0, max_bytes=1000)
        assert proxied.status == 502 and b"2000 bytes" in proxied.body

    asyncio.run(run())


def test_the_engine_gets_a_little_less_than_prometheuss_scrape_timeout() -> None:
    assert scrape_timeout("10") == 9.75
    assert scrape_timeout("3") == 2.75
    assert scrape_timeout(None) == 9.75
    assert scrape_timeout("60") == 9.75  # never longer than the agent's own bound
    assert scrape_timeout("soon") == 9.75
    assert scrape_timeout("0.1") == 0.5
