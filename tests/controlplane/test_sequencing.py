"""Duplicates and late retries are acknowledged and ignored; an agent restart (sequence reset) is applied."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from agent.wire import ReplicaState
from controlplane.fleet.sequencing import Verdict, classify
from tests.controlplane.fixtures import T0, body, replica, report


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(("last", "incoming", "verdict"), [
    (None, (0, 0), Verdict.NEW),
    ((5, 50), (6, 60), Verdict.NEW),
    ((5, 50), (9, 40), Verdict.NEW),  # the agent's clock stepped back: the sequence still rules
    ((5, 50), (5, 50), Verdict.DUPLICATE),
    ((5, 50), (4, 40), Verdict.OUT_OF_ORDER),
    ((5, 50), (5, 45), Verdict.OUT_OF_ORDER),
    ((5, 50), (0, 70), Verdict.RESET),  # the agent restarted and counts from zero again
    ((5, 50), (5, 70), Verdict.RESET),
])
def test_classify(last, incoming, verdict: Verdict) -> None:
    got = classify(
        last_sequence=None if last is None else last[0], last_sent_at=None if last is None else at(last[1]),
        sequence=incoming[0], sent_at=at(incoming[1]),
    )
    assert got == verdict


def states(client: TestClient) -> list[tuple[str, str]]:
    return [(r["name"], r["state"]) for r in client.get("/v1/replicas").json()]


def test_duplicate_and_late_reports_are_acknowledged_but_ignored(client: TestClient) -> None:
    first = report(sequence=5, sent_at=at(50), replicas=[replica("r0")])
    assert client.post("/v1/agents/gpu-a/report", json=body(first)).status_code == 200
    late = report(sequence=4, sent_at=at(40), replicas=[replica("r0", state=ReplicaState.FATAL)])
    duplicate = report(sequence=5, sent_at=at(50), replicas=[replica("r0", state=ReplicaState.STOPPED)])
    for stale in (late, duplicate):
        response = client.post("/v1/agents/gpu-a/report", json=body(stale))
        assert response.status_code == 200 and response.json()["node"] == "gpu-a"
    assert states(client) == [("r0", "READY")]
    node = client.get("/v1/nodes/gpu-a").json()
    assert node["last_sequence"] == 5 and node["reports_total"] == 1
    metrics = client.get("/metrics").text
    assert 'pitstop_cp_reports_received_total{outcome="duplicate"} 1.0' in metrics
    assert 'pitstop_cp_reports_received_total{outcome="out_of_order"} 1.0' in metrics


def test_restarted_agent_is_heard_from_sequence_zero(client: TestClient, clock) -> None:
    client.post("/v1/agents/gpu-a/report", json=body(report(sequence=900, sent_at=at(50))))
    clock.advance(60)
    restarted = report(sequence=0, sent_at=at(110), replicas=[replica("r0", state=ReplicaState.STARTING)])
    client.post("/v1/agents/gpu-a/report", json=body(restarted))
    client.post("/v1/agents/gpu-a/report",
                json=body(report(sequence=1, sent_at=at(115), replicas=[replica("r0", state=ReplicaState.WARMING)])))
    assert states(client) == [("r0", "WARMING")]
    assert client.get("/v1/nodes/gpu-a").json()["last_sequence"] == 1
