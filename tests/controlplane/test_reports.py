"""A report goes in; the fleet it describes comes out of every read endpoint."""

from __future__ import annotations

from datetime import timedelta

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.wire import DesiredState, ReplicaState
from controlplane.store.db import make_engine, session_scope
from controlplane.store.models import DesiredReplica, Replica
from tests.controlplane.fixtures import T0, body, replica, report, transition


def post(client: TestClient, r, node: str | None = None):
    return client.post(f"/v1/agents/{node or r.node}/report", json=body(r))


def test_report_answers_desired_state_and_fills_the_fleet(client: TestClient) -> None:
    events = [transition("r0", T0 - timedelta(seconds=40), ReplicaState.STARTING, ReplicaState.WARMING),
              transition("r0", T0 - timedelta(seconds=10), ReplicaState.WARMING, ReplicaState.READY, "warm")]
    response = post(client, report(replicas=[replica("r0"), replica("r1", state=ReplicaState.BACKOFF, restarts=3)],
                                   events=events))
    assert response.status_code == 200
    answer = DesiredState.model_validate(response.json())
    assert answer.node == "gpu-a" and answer.replicas == []

    nodes = client.get("/v1/nodes").json()
    assert [(n["name"], n["status"], n["replica_count"], n["gpu_count"]) for n in nodes] == [("gpu-a", "up", 2, 1)]

    replicas = client.get("/v1/replicas").json()
    assert [(r["name"], r["state"], r["ready"], r["restarts_total"]) for r in replicas] == [
        ("r0", "READY", True, 0), ("r1", "BACKOFF", False, 3)]
    assert replicas[0]["engine"]["ttft_p99_seconds"] == 0.12
    assert replicas[0]["process"]["rss_bytes"] == 1_800 * 1024**2

    one = client.get("/v1/replicas/gpu-a/r1").json()
    assert one["engine_args"] == ["--max-num-seqs", "64"] and one["log_tail"] == ["INFO started"]
    assert client.get("/v1/replicas/gpu-a/nope").status_code == 404

    gpus = client.get("/v1/gpus").json()
    assert gpus[0]["temperature_celsius"] == 61.0 and gpus[0]["slowdown_temperature_celsius"] == 89.0

    got = client.get("/v1/events").json()
    assert [(e["from_state"], e["to_state"]) for e in got] == [("WARMING", "READY"), ("STARTING", "WARMING")]
    assert client.get("/v1/events", params={"replica": "r1"}).json() == []

    detail = client.get("/v1/nodes/gpu-a").json()
    assert {r["name"] for r in detail["replicas"]} == {"r0", "r1"} and len(detail["gpus"]) == 1
    assert client.get("/v1/nodes/gpu-b").status_code == 404


def test_events_sent_again_are_stored_once(client: TestClient, clock) -> None:
    # An agent sends again what it cannot know was delivered: a report whose answer it never read, or the
    # undelivered events a killed agent left on disk, which its successor sends first.
    draining = transition("r0", T0 - timedelta(seconds=3), ReplicaState.READY, ReplicaState.DRAINING)
    stopping = transition("r0", T0 - timedelta(seconds=2), ReplicaState.DRAINING, ReplicaState.STOPPING)
    post(client, report(sequence=1, events=[draining]))
    clock.advance(1)
    post(client, report(sequence=2, sent_at=T0 + timedelta(seconds=1), events=[draining, stopping]))
    clock.advance(1)
    post(client, report(sequence=1, sent_at=T0 + timedelta(seconds=2), events=[draining, stopping]))  # restarted
    got = client.get("/v1/events").json()
    assert [(e["from_state"], e["to_state"]) for e in got] == [("DRAINING", "STOPPING"), ("READY", "DRAINING")]


def test_replica_filters(client: TestClient) -> None:
    post(client, report("gpu-a", replicas=[replica("r0"), replica("r1", model="other")]))
    post(client, report("gpu-b", replicas=[replica("r0", state=ReplicaState.FATAL)]))
    names = lambda **q: [(r["node"], r["name"]) for r in client.get("/v1/replicas", params=q).json()]  # noqa: E731
    assert names(node="gpu-b") == [("gpu-b", "r0")]
    assert names(model="other") == [("gpu-a", "r1")]
    assert names(state="fatal") == [("gpu-b", "r0")]


def test_next_report_replaces_the_node_picture_and_appends_samples(client: TestClient, clock) -> None:
    post(client, report(sequence=1, replicas=[replica("r0", ttft=0.1), replica("gone")]))
    clock.advance(5)
    post(client, report(sequence=2, sent_at=T0 + timedelta(seconds=5), replicas=[replica("r0", ttft=0.3)]))
    assert [r["name"] for r in client.get("/v1/replicas").json()] == ["r0"]
    samples = client.get("/v1/replicas/gpu-a/r0/samples").json()
    assert [s["values"]["ttft_p99_seconds"] for s in samples] == [0.1, 0.3]
    since = (T0 + timedelta(seconds=1)).isoformat()
    assert len(client.get("/v1/replicas/gpu-a/r0/samples", params={"since": since}).json()) == 1


def test_desired_state_comes_from_the_table(client: TestClient, config) -> None:
    post(client, report())
    engine = make_engine(config.database_url)
    with Session(engine) as session, session.begin():
        session.add(DesiredReplica(node="gpu-a", name="r0", generation=7, engine_args=["--max-num-seqs", "32"],
                                   enabled=True, updated_at=T0))
    engine.dispose()
    answer = DesiredState.model_validate(post(client, report(sequence=2, sent_at=T0 + timedelta(seconds=5))).json())
    assert [(s.name, s.generation, s.engine_args) for s in answer.replicas] == [("r0", 7, ["--max-num-seqs", "32"])]


def test_openapi_documents_the_report_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/v1/agents/{node}/report"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/NodeReport")
    assert "ReplicaStatus" in spec["components"]["schemas"]
    assert client.get("/docs").status_code == 200


def test_any_sequence_the_wire_accepts_is_stored(client: TestClient) -> None:
    # A 64-bit counter fits (on PostgreSQL the column once was 32-bit: a 500); beyond it is a 422, not a crash.
    big = body(report(sequence=2**40))
    assert client.post("/v1/agents/gpu-a/report", json=big).status_code == 200
    assert client.get("/v1/nodes/gpu-a").json()["last_sequence"] == 2**40
    too_big = {**big, "sequence": 2**63}
    assert client.post("/v1/agents/gpu-a/report", json=too_big).status_code == 422


def test_a_reading_stored_before_the_wire_bounded_it_reads_as_unknown(client: TestClient, app: FastAPI) -> None:
    assert post(client, report()).status_code == 200
    with session_scope(app.state.pitstop.sessions) as session:  # what an older control plane accepted
        row = session.get(Replica, ("gpu-a", "r0"))
        assert row is not None and row.engine is not None
        row.engine = {**row.engine, "requests_running": -3.0, "ttft_p99_seconds": 0.5}
    got = client.get("/v1/replicas/gpu-a/r0")
    assert got.status_code == 200, got.text
    engine = got.json()["engine"]
    assert engine["requests_running"] is None and engine["ttft_p99_seconds"] == 0.5
