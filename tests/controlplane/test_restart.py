"""Stopping the control plane mid-way loses nothing: reports, proposed and approved actions survive."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.policy.guardrails import Decision, Verdict
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation.records import record_decision
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import body, replica, report

OPS = {"Authorization": "Bearer ops"}


def _app(db_url: str, clock, jobs: bool = False) -> TestClient:
    config = ServerConfig(database_url=db_url, operator_tokens=["ops"], agent_tokens=["agent"],
                          executor_interval_seconds=0.2)
    return TestClient(create_app(config, clock=clock, run_jobs=jobs))


def _proposal(name: str, verdict: Verdict) -> Decision:
    action = ProposedAction(policy="leak", kind="restart", reason="rss grows", model="m-" + name,
                            target=Target(kind="replica", node="gpu-a", replica=name), replicas=[f"gpu-a/{name}"])
    return Decision(action=action, verdict=verdict)


def test_restart_between_report_and_reads_and_between_proposed_and_applied(db_url: str, clock) -> None:
    with _app(db_url, clock) as first:
        reported = report(replicas=[replica("r0", model="m-r0"), replica("r1", model="m-r1")])
        assert first.post("/v1/agents/gpu-a/report", json=body(reported),
                          headers={"Authorization": "Bearer agent"}).status_code == 200
        with session_scope(first.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
            proposed = record_decision(session=session, decision=_proposal("r0", Verdict.AWAITING_APPROVAL),
                                       now=clock(), requested_by="policy:leak", policy="leak").id
            approved = record_decision(session=session, decision=_proposal("r1", Verdict.ALLOWED),
                                       now=clock(), requested_by="policy:leak", policy="leak").id
    # A new process on the same database, this time running the scheduler.
    with _app(db_url, clock, jobs=True) as second:
        assert [r["name"] for r in second.get("/v1/replicas", headers=OPS).json()] == ["r0", "r1"]
        assert len(second.get("/v1/replicas/gpu-a/r0/samples", headers=OPS).json()) == 1
        assert second.get(f"/v1/actions/{proposed}", headers=OPS).json()["state"] == "proposed"
        from tests.helpers import wait_until

        wait_until(lambda: second.get(f"/v1/actions/{approved}", headers=OPS).json()["state"] == "running",
                   timeout=10, what="the leader's executor to apply the approved action")
        assert second.post(f"/v1/actions/{proposed}/approve", headers=OPS).json()["state"] == "running"
        desired = {d["name"]: d["generation"] for d in second.get("/v1/desired", headers=OPS).json()}
    assert desired == {"r0": 2, "r1": 2}
    with _app(db_url, clock) as third:  # and once more: applied actions are not applied again
        assert {d["name"]: d["generation"] for d in third.get("/v1/desired", headers=OPS).json()} == desired
        assert {a["state"] for a in third.get("/v1/actions", headers=OPS).json()} == {"running"}
