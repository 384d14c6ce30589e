"""The agent's HTTP API over a fake agent view: readiness for load balancers, replica list, /metrics."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from agent.api import EmbeddedServer, create_app, http_date, server_config
from agent.exporter import AgentCollector, ExportState
from agent.lean_client import scrape_client
from agent.wire import ReplicaState, ReplicaStatus
from tests.helpers import free_port

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class FakeAgent:
    def __init__(self) -> None:
        self.node = "n1"
        self.replicas = [
            ReplicaStatus(name="up", model="m", url="u", state=ReplicaState.READY, ready=True, state_since=NOW),
            ReplicaStatus(name="draining", model="m", url="u", state=ReplicaState.DRAINING, ready=False,
                          state_since=NOW),
        ]
        self.registry = CollectorRegistry()
        self.registry.register(AgentCollector(lambda: ExportState(node=self.node, replicas=self.replicas)))

    def statuses(self) -> list[ReplicaStatus]:
        return self.replicas

    def status_of(self, name: str) -> ReplicaStatus | None:
        return next((s for s in self.replicas if s.name == name), None)


def test_ready_endpoint_is_200_only_when_ready() -> None:
    client = TestClient(create_app(FakeAgent()))
    assert client.get("/v1/replicas/up/ready").status_code == 200
    draining = client.get("/v1/replicas/draining/ready")
    assert draining.status_code == 503 and draining.json()["state"] == "DRAINING"
    assert client.get("/v1/replicas/nope/ready").status_code == 404


def test_replica_list_health_and_metrics() -> None:
    client = TestClient(create_app(FakeAgent()))
    assert client.get("/healthz").json()["status"] == "ok"
    listed = client.get("/v1/replicas").json()
    assert [r["name"] for r in listed] == ["up", "draining"]
    assert [ReplicaStatus.model_validate(r).state for r in listed] == [ReplicaState.READY, ReplicaState.DRAINING]
    assert client.get("/v1/replicas/up").json()["ready"] is True
    text = client.get("/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "pitstop_replica_state" in names


def test_head_is_get_without_a_body_other_methods_are_405_and_unknown_paths_404() -> None:
    client = TestClient(create_app(FakeAgent()))
    head = client.head("/v1/replicas/draining/ready")
    assert head.status_code == 503 and head.content == b"" and int(head.headers["content-length"]) > 0
    refused = client.post("/v1/replicas/up/ready")
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
    for path in ("/", "/v1", "/v1/replicas/up/ready/more", "/engines/up", "/v1/nodes"):
        assert client.get(path).status_code == 404, path
    missing = client.get("/v1/replicas/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


def test_replica_json_is_the_wire_model_as_the_control_plane_reads_it() -> None:
    agent = FakeAgent()
    client = TestClient(create_app(agent))
    assert client.get("/v1/replicas").json() == [r.model_dump(mode="json") for r in agent.replicas]
    assert client.get("/v1/replicas/up").json() == agent.replicas[0].model_dump(mode="json")
    assert client.get("/v1/replicas/up").headers["content-type"] == "application/json"


def test_the_server_sends_one_date_header_and_needs_no_tick_to_stop() -> None:
    # uvicorn's own Date header is kept fresh by a tick every second; the agent's app makes its own instead, so
    # an idle agent's server does not wake at all.
    async def scenario() -> tuple[list[str], int]:
        port = free_port()
        server = EmbeddedServer(server_config(create_app(FakeAgent()), "127.0.0.1", port))
        serving = asyncio.create_task(server.serve())
        await asyncio.wait_for(server.listening.wait(), 10)
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{port}/v1/replicas/up/ready")
        server.exit()
        await asyncio.wait_for(serving, 10)
        return answer.headers.get_list("date"), answer.status_code

    dates, status = asyncio.run(scenario())
    assert status == 200 and len(dates) == 1
    assert parsedate_to_datetime(dates[0]).tzinfo is not None


def test_the_date_header_is_made_once_a_second() -> None:
    first = http_date(1_800_000_000.2)
    assert http_date(1_800_000_000.9) is first
    assert first == formatdate(1_800_000_000, usegmt=True).encode() == b"Fri, 15 Jan 2027 08:00:00 GMT"
    assert http_date(1_800_000_001.0) == b"Fri, 15 Jan 2027 08:00:01 GMT"


@pytest.mark.slow
def test_an_idle_scrape_connection_is_kept_past_uvicorns_five_seconds() -> None:
    # Prometheus scrapes every 15 s or so: with uvicorn's 5 s every scrape was a new connection (and a close).
    async def scenario() -> tuple[int, int]:
        port = free_port()
        server = EmbeddedServer(server_config(create_app(FakeAgent()), "127.0.0.1", port))
        serving = asyncio.create_task(server.serve())
        await asyncio.wait_for(server.listening.wait(), 10)
        try:
            async with scrape_client() as client:
                first = await client.get(f"http://127.0.0.1:{port}/v1/replicas/up/ready")
                await asyncio.sleep(6)
                second = await client.get(f"http://127.0.0.1:{port}/v1/replicas/up/ready")
                return client.plain.connections_opened, first.status_code + second.status_code
        finally:
            server.exit()
            await asyncio.wait_for(serving, 10)

    opened, statuses = asyncio.run(scenario())
    assert statuses == 400 and opened == 1
