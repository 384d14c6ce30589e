"""Operator actions through the guardrails, applied by the executor and judged by what agents report."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from agent.wire import ReplicaState
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.policy.guardrails import Decision, Verdict
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation.executor import reconcile
from controlplane.remediation.records import record_decision
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import FakeClock, body, replica, report

OPS = {"Authorization": "Bearer ops"}
ADMIN = {"Authorization": "Bearer root"}
AGENT = {"Authorization": "Bearer agent"}


@pytest.fixture
def c(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, operator_tokens=["ops"], admin_tokens=["root"],
                          agent_tokens=["agent"], viewer_tokens=["look"], action_deadline_seconds=300)
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        yield client


def send(c: TestClient, seq: int, *replicas: object, node: str = "gpu-a") -> dict:
    r = report(node, sequence=seq, replicas=list(replicas) if replicas else None)  # type: ignore[arg-type]
    answer = c.post(f"/v1/agents/{node}/report", json=body(r), headers=AGENT)
    assert answer.status_code == 200
    return dict(answer.json())


def reconcile_now(c: TestClient) -> dict[int, str]:
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    with session_scope(ctx.sessions) as session:
        return reconcile(session=session, now=ctx.clock(), deadline=timedelta(seconds=300))


def at_generation(name: str, generation: int, state: ReplicaState = ReplicaState.READY) -> object:
    return replica(name, state=state).model_copy(update={"generation": generation})


def test_restart_goes_to_a_new_generation_and_succeeds_when_reported_ready(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"))
    made = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart", "reason": "slow"}, headers=OPS)
    assert made.status_code == 201
    action = made.json()
    assert (action["state"], action["requested_by"], action["policy"]) == ("running", "config:operator-0", None)
    desired = send(c, 2, replica("r0"), replica("r1"))["replicas"]
    # A restart asks the agent to dump the old engine's stacks before draining it.
    assert desired == [{"name": "r0", "generation": 2, "engine_args": ["--max-num-seqs", "64"], "enabled": True,
                        "capture_stack": True}]
    assert reconcile_now(c) == {}  # still at generation 1
    send(c, 3, at_generation("r0", 2), replica("r1"))
    assert reconcile_now(c) == {action["id"]: "succeeded"}
    done = c.get(f"/v1/actions/{action['id']}", headers=OPS).json()
    assert done["state"] == "succeeded" and done["finished_at"] is not None
    assert c.get("/v1/actions?state=succeeded&target=replica:gpu-a/r0", headers=OPS).json()[0]["id"] == action["id"]
    audit = c.get("/v1/audit", headers=ADMIN).json()
    assert audit[0]["what"] == "action.restart" and audit[0]["actor"] == "config:operator-0"
    assert audit[0]["client"]  # from where


def test_set_flags_drain_and_failure(c: TestClient, clock: FakeClock) -> None:
    # Two models, so neither action eats the other's disruption budget.
    other = replica("r1", model="other"), replica("r2", model="other")
    send(c, 1, replica("r0"), replica("r3"), *other)
    flags = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "set_flags", "engine_args": ["--max-num-seqs", "32"]},
                   headers=OPS).json()
    drain = c.post("/v1/replicas/gpu-a/r1/actions", json={"kind": "drain"}, headers=OPS).json()
    desired = {s["name"]: s for s in send(c, 2, replica("r0"), replica("r3"), *other)["replicas"]}
    assert desired["r0"]["engine_args"] == ["--max-num-seqs", "32"] and desired["r0"]["generation"] == 2
    assert desired["r1"]["enabled"] is False
    send(c, 3, at_generation("r0", 2, ReplicaState.FATAL), replica("r3"),
         replica("r1", state=ReplicaState.STOPPED, model="other"), other[1])
    assert reconcile_now(c) == {flags["id"]: "failed", drain["id"]: "succeeded"}
    assert "FATAL" in c.get(f"/v1/actions/{flags['id']}", headers=OPS).json()["outcome"]


def test_a_models_rolling_restart_goes_one_replica_at_a_time_within_the_budget(c: TestClient, clock: FakeClock
                                                                               ) -> None:
    send(c, 1, replica("r0"), replica("r1"), replica("r2"))
    assert c.post("/v1/models/nope/actions", json={"kind": "rolling_restart"}, headers=OPS).status_code == 404
    assert c.post("/v1/models/tiny-llama/actions", json={"kind": "rolling_restart"},
                  headers={"Authorization": "Bearer look"}).status_code == 403
    made = c.post("/v1/models/tiny-llama/actions", json={"kind": "rolling_restart", "reason": "new driver"},
                  headers=OPS)
    assert made.status_code == 201
    action = made.json()
    assert (action["kind"], action["state"], action["target"]) == ("rolling_restart", "running", "model:tiny-llama")
    assert action["replicas"] == ["gpu-a/r0", "gpu-a/r1", "gpu-a/r2"]

    def generations(seq: int, *replicas: object) -> dict[str, int]:
        return {s["name"]: s["generation"] for s in send(c, seq, *replicas)["replicas"]}

    reconcile_now(c)  # the first batch starts
    assert generations(2, replica("r0"), replica("r1"), replica("r2")) == {"r0": 2}
    reconcile_now(c)  # r0 not back yet: nothing else moves
    assert generations(3, at_generation("r0", 2, ReplicaState.WARMING), replica("r1"), replica("r2")) == {"r0": 2}
    reconcile_now(c)
    assert generations(4, at_generation("r0", 2), replica("r1"), replica("r2")) == {"r0": 2}
    reconcile_now(c)  # r0 READY: it settles back into the load balancer's rotation before r1 leaves it
    assert generations(5, at_generation("r0", 2), replica("r1"), replica("r2")) == {"r0": 2}
    settling = c.get(f"/v1/actions/{action['id']}", headers=OPS).json()["params"]["rollout"]["waiting"]
    assert settling == "settling: gpu-a/r0 READY for 0 of 5s"
    clock.advance(5)
    reconcile_now(c)
    assert generations(6, at_generation("r0", 2), replica("r1"), replica("r2")) == {"r0": 2, "r1": 2}
    send(c, 7, at_generation("r0", 2), at_generation("r1", 2), replica("r2"))
    reconcile_now(c)
    clock.advance(5)
    reconcile_now(c)
    send(c, 8, at_generation("r0", 2), at_generation("r1", 2), at_generation("r2", 2))
    reconcile_now(c)
    clock.advance(5)
    assert reconcile_now(c) == {action["id"]: "succeeded"}
    audit = c.get("/v1/audit", headers=ADMIN).json()
    assert [a["what"] for a in audit] == ["action.rolling_restart"]


@pytest.mark.parametrize("spelled", ["meta-llama/Llama-3.1-8B-Instruct", "meta-llama%2FLlama-3.1-8B-Instruct"])
def test_a_model_named_by_its_hub_path_is_acted_on_slash_and_all(c: TestClient, spelled: str) -> None:
    hub = "meta-llama/Llama-3.1-8B-Instruct"
    send(c, 1, replica("r0", model=hub), replica("r1", model=hub))
    made = c.post(f"/v1/models/{spelled}/actions", json={"kind": "rolling_restart"}, headers=OPS)
    assert made.status_code == 201, made.text
    assert made.json()["target"] == f"model:{hub}" and made.json()["replicas"] == ["gpu-a/r0", "gpu-a/r1"]
    assert c.post("/v1/models/meta-llama/nope/actions", json={"kind": "rolling_restart"},
                  headers=OPS).status_code == 404


def test_running_action_fails_after_its_deadline(c: TestClient, clock: FakeClock) -> None:
    send(c, 1, replica("r0"), replica("r1"))
    action = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=OPS).json()
    clock.advance(301)
    assert reconcile_now(c) == {action["id"]: "failed"}


def test_guardrails_hold_back_operator_actions_and_admin_may_force(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"))  # one model, two READY replicas: budget keeps one READY
    first = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=OPS).json()
    second = c.post("/v1/replicas/gpu-a/r1/actions", json={"kind": "restart"}, headers=OPS).json()
    assert first["state"] == "running"
    assert second["state"] == "suppressed" and second["guardrails"][0]["guardrail"] == "disruption_budget"
    assert send(c, 2, replica("r0"), replica("r1"))["replicas"][-1]["name"] == "r0"  # r1 untouched
    refused = c.post("/v1/replicas/gpu-a/r1/actions", json={"kind": "restart", "force": True}, headers=OPS)
    assert refused.status_code == 403
    forced = c.post("/v1/replicas/gpu-a/r1/actions", json={"kind": "restart", "force": True}, headers=ADMIN).json()
    assert forced["state"] == "running" and "force" in forced["guardrails"][0]["reason"]
    assert c.get("/v1/audit", headers=ADMIN).json()[0]["detail"]["force"] is True


def test_cordon_reaches_the_agent_and_uncordon_undoes_it(c: TestClient) -> None:
    send(c, 1)
    assert c.post("/v1/nodes/gpu-x/actions", json={"kind": "cordon"}, headers=OPS).status_code == 404
    cordon = c.post("/v1/nodes/gpu-a/actions", json={"kind": "cordon"}, headers=OPS).json()
    assert cordon["state"] == "succeeded"
    answer = send(c, 2)
    # Protocol-1 agents forbid unknown fields: an unused GPU cordon list stays off the wire.
    assert answer["cordoned"] is True and "cordoned_gpus" not in answer
    assert c.post("/v1/nodes/gpu-a/actions", json={"kind": "uncordon"}, headers=OPS).json()["state"] == "succeeded"
    assert send(c, 3)["cordoned"] is False


def test_proposed_actions_are_approved_or_rejected_by_an_operator(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"))
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    ids = []
    with session_scope(ctx.sessions) as session:
        for name in ("r0", "r1"):
            proposal = ProposedAction(policy="itl-slo", kind="restart", reason="ITL p99 above 0.2s",
                                      target=Target(kind="replica", node="gpu-a", replica=name, model="tiny-llama"),
                                      replicas=[f"gpu-a/{name}"], model="tiny-llama")
            ids.append(record_decision(session=session, now=ctx.clock(), requested_by="policy:itl-slo",
                                       policy="itl-slo", decision=Decision(action=proposal,
                                                                            verdict=Verdict.AWAITING_APPROVAL)).id)
    assert [a["id"] for a in c.get("/v1/actions?state=proposed&policy=itl-slo", headers=OPS).json()] == ids[::-1]
    assert c.post(f"/v1/actions/{ids[0]}/approve", headers={"Authorization": "Bearer look"}).status_code == 403
    approved = c.post(f"/v1/actions/{ids[0]}/approve", headers=OPS).json()
    assert approved["state"] == "running" and approved["approved_by"] == "config:operator-0"
    rejected = c.post(f"/v1/actions/{ids[1]}/reject", headers=OPS).json()
    assert rejected["state"] == "rejected"
    assert c.post(f"/v1/actions/{ids[1]}/approve", headers=OPS).status_code == 409
    assert c.post("/v1/actions/9999/approve", headers=OPS).status_code == 404
    metrics = c.get("/metrics").text
    assert 'pitstop_cp_actions{kind="restart",state="rejected"} 1.0' in metrics


def test_actions_on_unknown_replicas_and_bad_requests_change_nothing(c: TestClient) -> None:
    send(c, 1)
    assert c.post("/v1/replicas/gpu-a/nope/actions", json={"kind": "restart"}, headers=OPS).status_code == 404
    assert c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "set_flags"}, headers=OPS).status_code == 422
    assert c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "explode"}, headers=OPS).status_code == 422
    assert c.get("/v1/actions", headers=OPS).json() == []
    assert c.get("/v1/alerts", headers=OPS).json() == []
