"""Duplicates are acknowledged, late reports refused with what the control plane holds (409), and an agent
restart (sequence reset) applied, whatever a skewed clock once said."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.reporter import Reporter, ReportError
from agent.wire import NodeReport, ReplicaState
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.fleet.sequencing import Verdict, classify
from controlplane.store.db import session_scope
from controlplane.store.models import Node
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


def test_a_duplicate_is_acknowledged_and_a_late_report_is_refused_naming_the_last_sequence(
        client: TestClient) -> None:
    first = report(sequence=5, sent_at=at(50), replicas=[replica("r0")])
    assert client.post("/v1/agents/gpu-a/report", json=body(first)).status_code == 200
    late = report(sequence=4, sent_at=at(40), replicas=[replica("r0", state=ReplicaState.FATAL)])
    duplicate = report(sequence=5, sent_at=at(50), replicas=[replica("r0", state=ReplicaState.STOPPED)])
    response = client.post("/v1/agents/gpu-a/report", json=body(duplicate))
    assert response.status_code == 200 and response.json()["node"] == "gpu-a"
    # A dropped report is not answered as if it had landed: the agent is told, with what to number past.
    response = client.post("/v1/agents/gpu-a/report", json=body(late))
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert (detail["reason"], detail["sequence"], detail["last_sequence"]) == ("out_of_order", 4, 5)
    assert datetime.fromisoformat(detail["last_sent_at"]) == at(50) and "above 5" in detail["message"]
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


@pytest.mark.parametrize(("last", "incoming", "horizon", "verdict"), [
    ((5, 50), (1, 10), 100, Verdict.OUT_OF_ORDER),  # the last sent_at is within reach of a sane clock
    ((5, 500), (1, 10), 100, Verdict.RESET),  # beyond it: written by a clock far ahead, not trusted
    ((5, 500), (6, 10), 100, Verdict.NEW),
])
def test_classify_does_not_trust_a_last_sent_at_past_the_horizon(last, incoming, horizon, verdict: Verdict) -> None:
    got = classify(last_sequence=last[0], last_sent_at=at(last[1]), sequence=incoming[0], sent_at=at(incoming[1]),
                   horizon=at(horizon))
    assert got == verdict


def post(client: TestClient, r: NodeReport) -> Any:
    return client.post(f"/v1/agents/{r.node}/report", json=body(r))


def test_a_clock_a_year_ahead_is_refused_so_the_restarted_agent_is_heard(client: TestClient, clock) -> None:
    assert post(client, report(sequence=1, sent_at=at(0), replicas=[replica("r0")])).status_code == 200
    # One report from a clock a year ahead: once, it was stored, and the restarted agent's reports (sequence 1,
    # 2, 3 with the right time) were all taken for late retries and answered 200: the node froze.
    skewed = report(sequence=2, sent_at=T0 + timedelta(days=365), replicas=[replica("r0", state=ReplicaState.FATAL)])
    response = post(client, skewed)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["sent_at"] and problem["type"] == "clock_skew"
    assert "31536000 s ahead of the control plane's clock" in problem["msg"] and "300 s" in problem["msg"]
    assert states(client) == [("r0", "READY")]
    clock.advance(10)
    restarted = report(sequence=1, sent_at=at(10), replicas=[replica("r0", state=ReplicaState.STARTING)])
    assert post(client, restarted).status_code == 200
    assert states(client) == [("r0", "STARTING")]
    assert 'pitstop_cp_reports_rejected_total{reason="clock_skew"} 1.0' in client.get("/metrics").text


def test_a_clock_behind_is_refused_too_and_the_bound_is_configurable(db_url: str, clock) -> None:
    with TestClient(create_app(ServerConfig(database_url=db_url, max_clock_skew_seconds=30), clock=clock)) as c:
        behind = post(c, report(sent_at=at(-45)))
        assert behind.status_code == 422
        [problem] = behind.json()["detail"]
        assert problem["loc"] == ["sent_at"] and "45 s behind" in problem["msg"] and "at most 30 s" in problem["msg"]
        assert post(c, report(sent_at=at(-25))).status_code == 200


def test_a_far_future_sent_at_stored_before_the_bound_no_longer_hides_a_restart(client: TestClient,
                                                                                app: FastAPI) -> None:
    assert post(client, report(sequence=700, sent_at=at(0))).status_code == 200
    with session_scope(app.state.pitstop.sessions) as session:  # what an older control plane accepted
        session.execute(update(Node).values(last_sent_at=T0 + timedelta(days=365)))
    restarted = report(sequence=1, sent_at=at(5), replicas=[replica("r0", state=ReplicaState.STARTING)])
    assert post(client, restarted).status_code == 200
    assert states(client) == [("r0", "STARTING")]
    assert client.get("/v1/nodes/gpu-a").json()["last_sequence"] == 1


def test_an_agent_restarted_while_its_clock_is_behind_its_last_run_is_heard_on_its_next_report(
        client: TestClient, clock, tmp_path: Path) -> None:
    # Its previous run's clock ran 250 s ahead (within the bound), so every report of the restarted agent is
    # sent "earlier" than the last one held, with a lower sequence: out of order. The 409 says which sequence
    # the control plane holds, and the agent numbers its next report past it.
    assert post(client, report(sequence=1000, sent_at=at(250), replicas=[replica("r0")])).status_code == 200

    def forward(request: httpx.Request) -> httpx.Response:
        answer = client.post(request.url.path, content=request.content, headers=dict(request.headers))
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    config = AgentConfig.model_validate({"node": "gpu-a", "control_plane": None, "gpu_backend": "sim",
                                         "sim_gpu_count": 0, "state_dir": str(tmp_path / "state")})

    async def restart() -> tuple[ReportError, int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(forward)) as http:
            agent = Agent(config, http, SimGpuBackend(tmp_path / "gpus", 0), wall=clock)
            agent.reporter = Reporter(http, "http://cp", "gpu-a", wall=clock)
            with pytest.raises(ReportError) as dropped:
                await agent.report_once()
            await agent.report_once()
            return dropped.value, agent.sequence

    dropped, sequence = asyncio.run(restart())
    assert dropped.status == 409 and dropped.kind == "out_of_order"
    assert "holds report 1000" in dropped.summary and "numbering the next report from 1001" in dropped.summary
    assert sequence == 1001
    node = client.get("/v1/nodes/gpu-a").json()
    assert node["last_sequence"] == 1001 and node["replica_count"] == 0  # the restarted agent's picture


def test_an_older_agent_that_ignores_the_409_is_heard_within_the_clock_skew_bound(client: TestClient,
                                                                                  clock) -> None:
    # It retries with backoff, counting on from its own low numbers, and reads nothing of the answer: once its
    # clock passes the held sent_at (at most max_clock_skew_seconds ahead of the control plane's), it is a reset.
    assert post(client, report(sequence=1000, sent_at=at(250), replicas=[replica("r0")])).status_code == 200
    answers = []
    for sequence, second in enumerate(range(0, 400, 60), start=1):
        clock.now = at(second)
        restarted = report(sequence=sequence, sent_at=at(second), replicas=[replica("r0", state=ReplicaState.WARMING)])
        answers.append(post(client, restarted).status_code)
    assert answers == [409, 409, 409, 409, 409, 200, 200]
    assert states(client) == [("r0", "WARMING")]
