"""Prometheus HTTP service discovery: every agent and every engine (through its agent) as a labelled target."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlplane.fleet.prometheus_targets import NodeAddress, ReplicaPlace, scrape_address, target_groups
from tests.controlplane.fixtures import body, replica, report


def test_agents_are_one_target_per_node_labelled_with_the_node() -> None:
    nodes = [NodeAddress("b", "b.example", "http://10.0.0.2:9400"), NodeAddress("a", "a.example", "http://10.0.0.1:9400")]
    assert target_groups("pitstop-agent", nodes, []) == [
        {"targets": ["10.0.0.1:9400"], "labels": {"node": "a"}},
        {"targets": ["10.0.0.2:9400"], "labels": {"node": "b"}},
    ]


def test_engines_are_scraped_through_their_agent_with_the_fleet_labels() -> None:
    nodes = [NodeAddress("a", "a.example", "http://10.0.0.1:9400")]
    replicas = [ReplicaPlace("a", "r1", "qwen-7b", [3, 2], "sglang"), ReplicaPlace("a", "r0", "llama-8b", [0])]
    assert target_groups("pitstop-engines", nodes, replicas) == [
        {"targets": ["10.0.0.1:9400"], "labels": {"__metrics_path__": "/engines/r0/metrics", "node": "a",
                                                  "replica": "r0", "model": "llama-8b", "engine": "vllm",
                                                  "gpu": "0"}},
        {"targets": ["10.0.0.1:9400"], "labels": {"__metrics_path__": "/engines/r1/metrics", "node": "a",
                                                  "replica": "r1", "model": "qwen-7b", "engine": "sglang",
                                                  "gpu": "2,3"}},
    ]


def test_an_agent_on_a_wildcard_address_is_reached_at_its_hostname_and_one_without_an_address_is_left_out() -> None:
    assert scrape_address(NodeAddress("a", "gpu-a.dc1", "http://0.0.0.0:9400")) == "gpu-a.dc1:9400"
    assert scrape_address(NodeAddress("a", "gpu-a.dc1", "http://[::]:9400")) == "gpu-a.dc1:9400"
    assert scrape_address(NodeAddress("a", "gpu-a.dc1", "http://[fd00::1]:9400")) == "[fd00::1]:9400"
    assert scrape_address(NodeAddress("a", "gpu-a.dc1", None)) is None
    # An engine on a node that cannot be scraped has no target either: Prometheus could not reach it.
    assert target_groups("pitstop-engines", [NodeAddress("a", "h", None)], [ReplicaPlace("a", "r0", "m", [0])]) == []


def test_the_endpoint_serves_what_the_agents_reported_and_refuses_an_unknown_job(client: TestClient) -> None:
    two = report(replicas=[replica("r0"), replica("r1", model="qwen-7b").model_copy(update={"engine_kind": "sglang"})])
    assert client.post("/v1/agents/gpu-a/report", json=body(two)).status_code == 200
    agents = client.get("/v1/prometheus/targets", params={"job": "pitstop-agent"})
    assert agents.status_code == 200
    assert agents.json() == [{"targets": ["127.0.0.1:9400"], "labels": {"node": "gpu-a"}}]
    engines = client.get("/v1/prometheus/targets", params={"job": "pitstop-engines"}).json()
    assert [(g["labels"]["replica"], g["labels"]["model"], g["labels"]["engine"], g["labels"]["__metrics_path__"])
            for g in engines] == [("r0", "tiny-llama", "vllm", "/engines/r0/metrics"),
                                  ("r1", "qwen-7b", "sglang", "/engines/r1/metrics")]
    assert client.get("/v1/prometheus/targets", params={"job": "nope"}).status_code == 422
    assert client.get("/v1/prometheus/targets").status_code == 422
