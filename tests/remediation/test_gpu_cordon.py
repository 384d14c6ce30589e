"""GPU cordons: the executor fences one GPU index on its node, the agent's answer lists it, uncordon gives it back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from controlplane.fleet.ingest import desired_state
from controlplane.policy.guardrails import Decision, Verdict
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation.executor import apply_action
from controlplane.remediation.records import record_decision
from controlplane.store.db import make_engine, make_sessionmaker, migrate
from controlplane.store.models import Node
from tests.controlplane.fixtures import T0
from tests.remediation.fleet import SimAgent, SimReplica, fleet


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'pitstop.db'}")
    migrate(engine)
    with make_sessionmaker(engine)() as s:
        s.add(Node(name="gpu-a", hostname="h", agent_version="0.1", agent_url=None, first_seen_at=T0,
                   last_report_at=T0, last_sent_at=T0, last_sequence=1))
        s.flush()
        yield s
    engine.dispose()


def _act(session: Session, kind: str, gpu: int | None) -> str:
    target = Target(kind="node", node="gpu-a") if gpu is None else Target(kind="gpu", node="gpu-a", gpu=gpu)
    params = {"scope": "node"} if gpu is None else {"scope": "gpu", "gpu": gpu}
    proposal = ProposedAction(policy="operator", kind=kind, target=target, params=params, reason=f"{kind} by test")
    row = record_decision(session=session, decision=Decision(action=proposal, verdict=Verdict.ALLOWED), now=T0,
                          requested_by="test", state="approved", approved_by="test")
    assert apply_action(session=session, action_id=row.id, now=T0)
    assert row.state == "succeeded", row.outcome
    return row.outcome


def _fence(session: Session) -> tuple[bool, list[int]]:
    session.flush()  # the answer is read with Core statements, as a report's transaction reads it
    answer = desired_state(session=session, node="gpu-a")
    return answer.cordoned, answer.cordoned_gpus


def test_cordoning_gpu_3_lists_it_and_uncordoning_empties_it(session: Session) -> None:
    _act(session, "cordon", 3)
    assert _fence(session) == (False, [3])  # the node itself stays in service
    _act(session, "cordon", 1)
    _act(session, "cordon", 3)  # twice is once
    assert _fence(session) == (False, [1, 3])
    _act(session, "uncordon", 3)
    _act(session, "uncordon", 1)
    assert _fence(session) == (False, [])


def test_node_cordons_and_gpu_cordons_do_not_touch_each_other(session: Session) -> None:
    _act(session, "cordon", 2)
    _act(session, "cordon", None)
    assert _fence(session) == (True, [2])
    _act(session, "uncordon", None)
    assert _fence(session) == (False, [2])  # the faulty GPU stays fenced after the node comes back


def test_a_gpu_scoped_xid_policy_cordons_only_the_gpu(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "xid-gpu.yaml").write_text(
        "name: xid-gpu\ncondition: {detector: xid, blast_radius: hardware, within: 15m}\n"
        "action: {kind: cordon, scope: gpu}\nguardrails: {cooldown: 1h}\n")
    agent = SimAgent("gpu-a", [SimReplica("r0")])
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)], policy_defaults=False) as f:
        f.run(30)
        agent.xid_total, agent.last_xid = 1, 79  # GPU 0 fell off the bus
        f.step(10)
        f.step(10)
        [cordon] = [a for a in f.actions() if a["kind"] == "cordon"]
        assert cordon["target"] == "gpu:gpu-a/0" and cordon["state"] == "succeeded"
        assert cordon["params"] == {"scope": "gpu", "gpu": 0}
        f.step(10)
        assert agent.desired is not None and (agent.desired.cordoned, agent.desired.cordoned_gpus) == (False, [0])
        f.run(60)
        assert len([a for a in f.actions() if a["kind"] == "cordon"]) == 1  # fenced already: not proposed again


def test_an_operator_cordons_and_uncordons_one_gpu_through_the_api(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0")])
    with fleet(tmp_path, [agent], policy_defaults=False) as f:
        f.step(10)
        answer = f.client.post("/v1/nodes/gpu-a/actions", json={"kind": "cordon", "gpu": 5})
        assert answer.status_code == 201 and answer.json()["target"] == "gpu:gpu-a/5"
        assert answer.json()["state"] == "succeeded"
        f.step(10)
        assert agent.desired is not None and (agent.desired.cordoned, agent.desired.cordoned_gpus) == (False, [5])
        assert f.client.post("/v1/nodes/gpu-a/actions", json={"kind": "cordon", "gpu": -1}).status_code == 422
        answer = f.client.post("/v1/nodes/gpu-a/actions", json={"kind": "uncordon", "gpu": 5})
        assert answer.json()["state"] == "succeeded" and answer.json()["kind"] == "uncordon"
        f.step(10)
        assert agent.desired.cordoned_gpus == []
