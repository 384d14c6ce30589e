"""Operators change a replica's desired state; the node's agent reads it in the answer to its next report."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from agent.wire import DesiredState, ReplicaState
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import T0, body, report, transition

OPS = {"Authorization": "Bearer ops"}


def next_answer(client: TestClient, sequence: int) -> DesiredState:
    r = report(sequence=sequence, sent_at=T0 + timedelta(seconds=sequence))
    return DesiredState.model_validate(client.post("/v1/agents/gpu-a/report", json=body(r)).json())


def test_new_args_restart_and_stop_each_reach_the_agent(client: TestClient) -> None:
    assert next_answer(client, 1).replicas == []  # the reported replica runs generation 1
    put = client.put("/v1/desired/gpu-a/r0", json={"engine_args": ["--max-num-seqs", "32"]})
    assert put.status_code == 200 and put.json()["generation"] == 2
    spec = next_answer(client, 2).replicas[0]
    assert (spec.name, spec.generation, spec.engine_args, spec.enabled) == ("r0", 2, ["--max-num-seqs", "32"], True)

    client.put("/v1/desired/gpu-a/r0", json={"restart": True})
    spec = next_answer(client, 3).replicas[0]
    assert (spec.generation, spec.engine_args) == (3, ["--max-num-seqs", "32"])

    client.put("/v1/desired/gpu-a/r0", json={"enabled": False})
    spec = next_answer(client, 4).replicas[0]
    assert (spec.generation, spec.enabled) == (3, False)  # stopping is not a new generation
    assert [d["name"] for d in client.get("/v1/desired", params={"node": "gpu-a"}).json()] == ["r0"]


def test_bad_names_are_refused(client: TestClient) -> None:
    assert client.put("/v1/desired/gpu-a/bad name", json={"restart": True}).status_code == 422
    assert client.get("/v1/desired").json() == []


@pytest.fixture
def guarded(db_url: str, clock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, agent_tokens=["agent"], operator_tokens=["ops"], viewer_tokens=["v"])
    with TestClient(create_app(config, clock=clock)) as c:
        yield c


def test_writes_need_an_operator_token(guarded: TestClient) -> None:
    url, change = "/v1/desired/gpu-a/r0", {"restart": True}
    assert guarded.put(url, json=change).status_code == 401
    assert guarded.put(url, json=change, headers={"Authorization": "Bearer v"}).status_code == 403
    assert guarded.put(url, json=change, headers=OPS).status_code == 200
    assert guarded.get("/v1/desired", headers={"Authorization": "Bearer v"}).status_code == 200


def test_writes_are_closed_when_tokens_exist_but_no_operator_token(db_url: str, clock) -> None:
    with TestClient(create_app(ServerConfig(database_url=db_url, agent_tokens=["agent"]), clock=clock)) as c:
        assert c.put("/v1/desired/gpu-a/r0", json={"restart": True}).status_code == 401
        agent = {"Authorization": "Bearer agent"}
        assert c.put("/v1/desired/gpu-a/r0", json={"restart": True}, headers=agent).status_code == 403


def test_forgetting_a_node_removes_its_state_but_keeps_events(client: TestClient) -> None:
    events = [transition("r0", T0, ReplicaState.WARMING, ReplicaState.READY)]
    client.post("/v1/agents/gpu-a/report", json=body(report(events=events)))
    client.put("/v1/desired/gpu-a/r0", json={"restart": True})
    assert client.delete("/v1/nodes/gpu-a").status_code == 204
    assert client.get("/v1/nodes").json() == [] and client.get("/v1/replicas").json() == []
    assert client.get("/v1/gpus").json() == [] and client.get("/v1/desired").json() == []
    assert len(client.get("/v1/events").json()) == 1
    assert client.delete("/v1/nodes/gpu-a").status_code == 404
    # The agent comes back: it is a new node again, and its next sequence is accepted.
    client.post("/v1/agents/gpu-a/report", json=body(report(sequence=1)))
    assert [n["name"] for n in client.get("/v1/nodes").json()] == ["gpu-a"]


def test_forgetting_needs_an_operator(guarded: TestClient) -> None:
    assert guarded.delete("/v1/nodes/gpu-a", headers={"Authorization": "Bearer v"}).status_code == 403
