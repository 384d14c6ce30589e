"""The agent's HTTP API over a fake agent view: readiness for load balancers, replica list, /metrics."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from agent.api import create_app
from agent.exporter import AgentCollector, ExportState
from agent.wire import ReplicaState, ReplicaStatus

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
