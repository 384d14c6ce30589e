"""Typed actions in a real store: each kind comes back as it was asked, every state change is in the action's
trail, and a stored payload that no longer fits its kind fails that action alone (the loop goes on) while the
API still lists it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from agent.wire import ReplicaState
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.policy import payloads as p
from controlplane.policy.guardrails import Decision, Verdict
from controlplane.policy.kinds import ActionKind
from controlplane.policy.lifecycle import ActionState, IllegalTransition
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation import records
from controlplane.remediation.executor import apply_action, apply_approved, reconcile
from controlplane.store.db import make_engine, make_sessionmaker, migrate, session_scope
from controlplane.store.models import ActionRow, DesiredReplica, Node, Replica
from tests.controlplane.fixtures import FakeClock

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
S = ActionState
MODEL = "tiny-llama"
DEADLINE = timedelta(minutes=10)


def _seed(session: Session) -> None:
    """Node gpu-a with three READY replicas of one model at generation 1."""
    session.add(Node(name="gpu-a", hostname="h", agent_version="0.1", agent_url=None, first_seen_at=T0,
                     last_report_at=T0, last_sent_at=T0, last_sequence=1))
    session.flush()
    for name in ("r0", "r1", "r2"):
        session.add(Replica(node="gpu-a", name=name, model=MODEL, url="http://127.0.0.1:9001", managed=True,
                            state=ReplicaState.READY, ready=True, generation=1, gpus=[0],
                            engine_args=["--max-num-seqs", "64"], restarts_total=0, state_since=T0,
                            last_exit_code=None, log_tail=["INFO started"], engine=None, process=None,
                            canary_ttft_seconds=None, canary_ok=None, updated_at=T0))


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'pitstop.db'}")
    migrate(engine)
    made = make_sessionmaker(engine)
    with session_scope(made) as session:
        _seed(session)
    yield made
    engine.dispose()


@pytest.fixture
def session(sessions: sessionmaker[Session]) -> Iterator[Session]:
    with sessions() as s:
        yield s


def replica_target(name: str = "r0") -> Target:
    return Target(kind="replica", node="gpu-a", replica=name, model=MODEL)


# One payload per kind, with its target and the output class the API serves it as.
EXAMPLES: dict[ActionKind, tuple[BaseModel, Target, type[BaseModel]]] = {
    ActionKind.RESTART: (p.RestartPayload(), replica_target(), records.RestartActionOut),
    ActionKind.PLANNED_RESTART: (p.PlannedRestartPayload(within_seconds=1800, not_before=T0 + timedelta(minutes=20),
                                                         deadline=T0 + timedelta(minutes=30)),
                                 replica_target(), records.PlannedRestartActionOut),
    ActionKind.DRAIN: (p.DrainPayload(), replica_target(), records.DrainActionOut),
    ActionKind.ROLLING_RESTART: (p.RollingRestartPayload(batch_size=2), Target(kind="model", model=MODEL),
                                 records.RollingRestartActionOut),
    ActionKind.SET_FLAGS: (p.SetFlagsPayload(engine_args={"gpu-a/r0": ["--max-num-seqs", "32"]}), replica_target(),
                           records.SetFlagsActionOut),
    ActionKind.LOWER_MAX_NUM_SEQS: (p.MaxNumSeqsPayload(kind="lower_max_num_seqs", max_num_seqs=32, previous=64,
                                                        canary=True, judge=p.Judge(latencies=["itl_p99_seconds"])),
                                    replica_target(), records.MaxNumSeqsActionOut),
    ActionKind.RAISE_MAX_NUM_SEQS: (p.MaxNumSeqsPayload(kind="raise_max_num_seqs", max_num_seqs=128, previous=64),
                                    Target(kind="model", model=MODEL), records.MaxNumSeqsActionOut),
    ActionKind.ADD_ENGINE_FLAG: (p.AddEngineFlagPayload(flag="--enable-chunked-prefill", rung=1, max_num_seqs=64,
                                                        canary=True, judge=p.Judge(baseline="same_args")),
                                 replica_target(), records.AddEngineFlagActionOut),
    ActionKind.SET_LIVE_CAP: (p.SetLiveCapPayload(live_cap=16, previous=32), replica_target(),
                              records.SetLiveCapActionOut),
    ActionKind.CORDON: (p.CordonPayload(kind="cordon", scope="gpu", gpu=3),
                        Target(kind="gpu", node="gpu-a", gpu=3), records.CordonActionOut),
    ActionKind.UNCORDON: (p.CordonPayload(kind="uncordon"), Target(kind="node", node="gpu-a"), records.CordonActionOut),
    ActionKind.ALERT: (p.AlertPayload(severity="page", governed=True), replica_target(), records.AlertActionOut),
}


def proposal(payload: BaseModel, target: Target | None = None, replicas: list[str] | None = None,
             runbook_url: str | None = None) -> ProposedAction:
    return ProposedAction(policy="operator", payload=payload, target=target or replica_target(),
                          replicas=["gpu-a/r0"] if replicas is None else replicas, model=MODEL, reason="by test",
                          runbook_url=runbook_url)


def approved(session: Session, payload: BaseModel, replicas: list[str] | None = None, now: datetime = T0) -> int:
    row = records.record_decision(session=session, decision=Decision(action=proposal(payload, replicas=replicas),
                                                                     verdict=Verdict.ALLOWED, reason="within limits"),
                                  now=now, requested_by="test", approved_by="test")
    assert row.state == S.APPROVED
    return row.id


def corrupt(session: Session, action_id: int, params: str) -> None:
    """What a hand edit, a bad migration or an old writer may leave in the column."""
    session.execute(text("UPDATE actions SET params = :params WHERE id = :id"), {"params": params, "id": action_id})
    session.expire_all()


def trail(session: Session, action_id: int) -> list[tuple[ActionState | None, ActionState, datetime, str, str]]:
    out = records.get_action(session=session, action_id=action_id)
    assert out is not None
    return [(t.from_state, t.to_state, t.at, t.by, t.cause) for t in out.transitions]


def converge(session: Session, name: str, generation: int, state: ReplicaState = ReplicaState.READY,
             exit_code: int | None = None) -> None:
    """An agent's report of the replica, as ingest leaves the row."""
    replica = session.get(Replica, ("gpu-a", name))
    assert replica is not None
    replica.generation, replica.state, replica.ready = generation, state, state == ReplicaState.READY
    replica.last_exit_code = exit_code
    session.flush()


# --- each kind through the store -------------------------------------------------------------------------------

@pytest.mark.parametrize("via", ["create", "record_decision"])
@pytest.mark.parametrize("kind", list(ActionKind), ids=str)
def test_each_kind_round_trips_through_the_store(session: Session, kind: ActionKind, via: str) -> None:
    payload, target, out_class = EXAMPLES[kind]
    asked = proposal(payload, target)
    if via == "create":
        row = records.create(session=session, proposal=asked, state=S.PROPOSED, now=T0, requested_by="test",
                             policy="operator", guardrails=[])
    else:
        row = records.record_decision(session=session, decision=Decision(action=asked, verdict=Verdict.SHADOW),
                                      now=T0, requested_by="test", policy="operator")
    session.commit()
    session.expire_all()  # read back what the database holds, not the objects just written
    out = records.get_action(session=session, action_id=row.id)
    assert type(out) is out_class
    assert isinstance(out, records.ActionOutBase)
    assert out.params == payload
    assert out.target == target.key and out.model == MODEL
    # The API's JSON of it: the payload's JSON form, the kind beside it.
    served = out.model_dump(mode="json")
    assert served["kind"] == kind.value
    assert served["params"] == p.payload_json(payload) and "kind" not in served["params"]
    assert [type(a) for a in records.list_actions(session=session)] == [out_class]


def test_a_proposals_runbook_goes_into_the_stored_payload(session: Session) -> None:
    row = records.create(session=session, proposal=proposal(p.RestartPayload(), runbook_url="runbooks/stall.md"),
                         state=S.PROPOSED, now=T0, requested_by="test", policy="stall", guardrails=[])
    out = records.get_action(session=session, action_id=row.id)
    assert out is not None and out.params == p.RestartPayload(runbook_url="runbooks/stall.md")


def test_a_state_the_table_does_not_allow_at_creation_is_refused(session: Session) -> None:
    with pytest.raises(IllegalTransition, match="created running"):
        records.create(session=session, proposal=proposal(p.RestartPayload()), state=S.RUNNING, now=T0,
                       requested_by="test", policy=None, guardrails=[])
    assert session.scalars(select(ActionRow)).all() == []


# --- the trail -------------------------------------------------------------------------------------------------

def test_every_state_change_is_in_the_trail_with_its_time_and_cause(session: Session) -> None:
    action_id = approved(session, p.RestartPayload())
    assert apply_action(session=session, action_id=action_id, now=T0 + timedelta(seconds=1))
    assert not apply_action(session=session, action_id=action_id, now=T0 + timedelta(seconds=2)), "claimed once"
    converge(session, "r0", 2)
    assert reconcile(session=session, now=T0 + timedelta(seconds=30), deadline=DEADLINE) == {action_id: "succeeded"}
    assert trail(session, action_id) == [
        (None, S.APPROVED, T0, "test", "within limits"),
        (S.APPROVED, S.RUNNING, T0 + timedelta(seconds=1), "executor", "claimed by the executor"),
        (S.RUNNING, S.SUCCEEDED, T0 + timedelta(seconds=30), "executor", "every replica converged"),
    ]


def test_an_operators_decision_is_in_the_trail_by_name(session: Session) -> None:
    asked = proposal(p.RestartPayload())
    first = records.record_decision(session=session, decision=Decision(action=asked,
                                                                       verdict=Verdict.AWAITING_APPROVAL),
                                    now=T0, requested_by="policy:stall", policy="stall")
    second = records.record_decision(session=session, decision=Decision(action=asked,
                                                                        verdict=Verdict.AWAITING_APPROVAL),
                                     now=T0, requested_by="policy:stall", policy="stall")
    assert records.approve(session=session, action_id=first.id, by="alice", now=T0 + timedelta(minutes=1))
    assert records.reject(session=session, action_id=second.id, by="bob", now=T0 + timedelta(minutes=2),
                          reason="not now")
    assert not records.approve(session=session, action_id=second.id, by="alice", now=T0 + timedelta(minutes=3))
    assert trail(session, first.id)[1:] == [(S.PROPOSED, S.APPROVED, T0 + timedelta(minutes=1), "alice",
                                             "approved by alice")]
    assert trail(session, second.id)[1:] == [(S.PROPOSED, S.REJECTED, T0 + timedelta(minutes=2), "bob",
                                              "rejected by bob: not now")]


def test_an_illegal_transition_writes_nothing(session: Session) -> None:
    action_id = approved(session, p.AlertPayload())
    assert apply_action(session=session, action_id=action_id, now=T0)
    before = trail(session, action_id)
    assert before[-1][1] is S.SUCCEEDED
    with pytest.raises(IllegalTransition, match="from succeeded to running"):
        records.transition(session=session, action_id=action_id, src=S.SUCCEEDED, dst=S.RUNNING, now=T0)
    row = session.get(ActionRow, action_id)
    assert row is not None and row.state == S.SUCCEEDED
    assert trail(session, action_id) == before


# --- a corrupt stored payload ----------------------------------------------------------------------------------

CORRUPT = [
    pytest.param("set_flags", '{"engine_args": "not a dict"}', "engine_args", id="wrong-type"),
    pytest.param("set_flags", '{"engine_args": {"gpu-a/r1": ["--max-num-seqs", "32"]}, "bogus": 1}', "bogus",
                 id="unknown-key"),
    pytest.param("set_flags", '["--max-num-seqs", "32"]', "not an object", id="not-an-object"),
]


@pytest.mark.parametrize(("kind", "params", "problem"), CORRUPT)
def test_apply_fails_a_corrupt_action_alone_and_applies_the_rest(sessions: sessionmaker[Session], kind: str,
                                                                 params: str, problem: str) -> None:
    with session_scope(sessions) as session:
        before = approved(session, p.RestartPayload(), ["gpu-a/r0"])
        bad = approved(session, p.SetFlagsPayload(engine_args={"gpu-a/r1": ["--max-num-seqs", "32"]}), ["gpu-a/r1"])
        after = approved(session, p.DrainPayload(), ["gpu-a/r2"])
        corrupt(session, bad, params)
    now = T0 + timedelta(seconds=5)
    assert apply_approved(sessions=sessions, now=lambda: now) == [before, bad, after]
    with sessions() as session:
        row = session.get(ActionRow, bad)
        assert row is not None and row.kind == kind and row.state == S.FAILED
        assert problem in row.outcome and "cannot be applied or judged" in row.outcome
        assert row.finished_at == now
        assert [(src, dst) for src, dst, *_ in trail(session, bad)] == [
            (None, S.APPROVED), (S.APPROVED, S.RUNNING), (S.RUNNING, S.FAILED)]
        assert trail(session, bad)[-1][4] == row.outcome
        # Nothing was written for it; the others were applied.
        assert [session.get(ActionRow, i).state for i in (before, after)] == [S.RUNNING, S.RUNNING]  # type: ignore[union-attr]
        desired = {d.name: d for d in session.scalars(select(DesiredReplica).where(DesiredReplica.node == "gpu-a"))}
        assert set(desired) == {"r0", "r2"}
        assert desired["r0"].generation == 2 and desired["r0"].enabled is True
        assert desired["r2"].enabled is False


@pytest.mark.parametrize(("kind", "params", "problem"), CORRUPT)
def test_reconcile_fails_a_corrupt_action_alone_and_judges_the_rest(session: Session, kind: str, params: str,
                                                                    problem: str) -> None:
    bad = approved(session, p.SetFlagsPayload(engine_args={"gpu-a/r1": ["--max-num-seqs", "32"]}), ["gpu-a/r1"])
    good = approved(session, p.RestartPayload(), ["gpu-a/r0"])
    for action_id in (bad, good):
        assert apply_action(session=session, action_id=action_id, now=T0)
    corrupt(session, bad, params)  # running, then its payload no longer reads
    converge(session, "r0", 2)
    now = T0 + timedelta(seconds=30)
    assert reconcile(session=session, now=now, deadline=DEADLINE) == {bad: "failed", good: "succeeded"}
    row = session.get(ActionRow, bad)
    assert row is not None and row.state == S.FAILED and problem in row.outcome
    assert trail(session, bad)[-1] == (S.RUNNING, S.FAILED, now, "executor", row.outcome)
    assert reconcile(session=session, now=now + timedelta(seconds=2), deadline=DEADLINE) == {}, "failed once"


def test_a_corrupt_running_rollout_fails_and_the_other_rollout_advances(session: Session) -> None:
    bad = approved(session, p.RollingRestartPayload(), ["gpu-a/r0", "gpu-a/r1"])
    good = approved(session, p.RollingRestartPayload(), ["gpu-a/r2"])
    for action_id in (bad, good):
        assert apply_action(session=session, action_id=action_id, now=T0)
    corrupt(session, bad, '{"rollout": {"phase": "sideways"}}')
    assert reconcile(session=session, now=T0 + timedelta(seconds=2), deadline=DEADLINE) == {bad: "failed"}
    row = session.get(ActionRow, bad)
    assert row is not None and "rollout.phase" in row.outcome
    out = records.get_action(session=session, action_id=good)
    assert isinstance(out, records.RollingRestartActionOut) and out.params.rollout is not None
    assert out.params.rollout.batch == {"gpu-a/r2": 2}, "the healthy rollout started its batch"


def test_a_corrupt_action_reads_back_as_unreadable_with_its_problem(session: Session) -> None:
    action_id = approved(session, p.SetFlagsPayload(engine_args={"gpu-a/r0": ["--max-num-seqs", "32"]}))
    corrupt(session, action_id, '{"engine_args": "not a dict"}')
    out = records.get_action(session=session, action_id=action_id)
    assert isinstance(out, records.UnreadableActionOut)
    assert out.kind == "set_flags" and out.params == {"engine_args": "not a dict"}
    assert "engine_args" in out.problem and out.state == S.APPROVED
    assert [type(a) for a in records.list_actions(session=session)] == [records.UnreadableActionOut]


# --- the API ---------------------------------------------------------------------------------------------------

@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The API over a fresh store, as tests/controlplane/conftest.py builds it, with no jobs running."""
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'api.db'}", stale_after_seconds=30)
    with TestClient(create_app(config, clock=FakeClock(T0), run_jobs=False)) as c:
        yield c


def _sessions(client: TestClient) -> sessionmaker[Session]:
    made: sessionmaker[Session] = client.app.state.pitstop.sessions  # type: ignore[attr-defined]
    return made


def test_the_api_still_lists_a_corrupt_action(client: TestClient) -> None:
    with session_scope(_sessions(client)) as session:
        _seed(session)
        bad = records.create(session=session, proposal=proposal(p.SetFlagsPayload(engine_args={})), now=T0,
                             state=S.SHADOW, requested_by="test", policy=None, guardrails=[]).id
        good = records.create(session=session, proposal=proposal(EXAMPLES[ActionKind.ADD_ENGINE_FLAG][0]), now=T0,
                              state=S.SHADOW, requested_by="test", policy=None, guardrails=[]).id
        corrupt(session, bad, '{"engine_args": "not a dict", "bogus": 1}')
    listed = client.get("/v1/actions")
    assert listed.status_code == 200
    by_id = {a["id"]: a for a in listed.json()}
    assert set(by_id) == {bad, good}
    assert by_id[bad]["kind"] == "set_flags"
    assert by_id[bad]["params"] == {"engine_args": "not a dict", "bogus": 1}  # as stored
    assert "engine_args" in by_id[bad]["problem"] and "bogus" in by_id[bad]["problem"]
    assert by_id[good]["params"]["flag"] == "--enable-chunked-prefill" and "problem" not in by_id[good]
    one = client.get(f"/v1/actions/{bad}")
    assert one.status_code == 200 and one.json()["problem"] == by_id[bad]["problem"]


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    resolved: dict[str, Any] = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return resolved


def test_openapi_documents_each_kinds_payload(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    answer = schema["paths"]["/v1/actions/{action_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    variants = answer["schema"]["anyOf"]
    [typed] = [v for v in variants if "oneOf" in v]
    [unreadable] = [_resolve(schema, v) for v in variants if "oneOf" not in v]
    assert typed["discriminator"]["propertyName"] == "kind"
    mapping = typed["discriminator"]["mapping"]
    assert set(mapping) == {k.value for k in ActionKind}
    assert {"problem", "params", "kind"} <= set(unreadable["properties"])
    for kind in ActionKind:
        out = _resolve(schema, {"$ref": mapping[kind.value]})
        params = _resolve(schema, out["properties"]["params"])
        assert params.get("additionalProperties") is False, kind  # unknown keys are refused, and say so
        assert "kind" not in params["properties"], kind  # the kind is beside the payload, not in it
        assert kind.value in str(out["properties"]["kind"]), kind
    flag = _resolve(schema, _resolve(schema, {"$ref": mapping["add_engine_flag"]})["properties"]["params"])
    assert {"flag", "rung", "value", "multi_gpu", "max_num_seqs", "judge", "rollout"} <= set(flag["properties"])
    assert set(flag["required"]) == {"flag", "rung", "max_num_seqs"}
    seqs = _resolve(schema, _resolve(schema, {"$ref": mapping["lower_max_num_seqs"]})["properties"]["params"])
    assert {"max_num_seqs", "previous", "engine_args"} <= set(seqs["properties"])
    # The list is documented the same way.
    listed = schema["paths"]["/v1/actions"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert listed["items"]["anyOf"] == variants


# --- what the store's edge must survive ------------------------------------------------------------------------

def test_a_restart_out_of_fatal_waits_for_the_new_generation_instead_of_failing(session: Session) -> None:
    # An operator's restart is the way out of FATAL: the report that still says FATAL at the old generation
    # predates the agent taking the restart, and must not fail it.
    converge(session, "r0", 1, ReplicaState.FATAL, exit_code=1)
    action = approved(session, p.RestartPayload())
    assert apply_action(session=session, action_id=action, now=T0)
    assert reconcile(session=session, now=T0 + timedelta(seconds=2), deadline=DEADLINE) == {}
    converge(session, "r0", 2)
    assert reconcile(session=session, now=T0 + timedelta(seconds=30), deadline=DEADLINE) == {action: "succeeded"}


def test_a_restart_that_itself_ends_fatal_fails(session: Session) -> None:
    action = approved(session, p.RestartPayload())
    assert apply_action(session=session, action_id=action, now=T0)
    converge(session, "r0", 2, ReplicaState.FATAL, exit_code=1)
    assert reconcile(session=session, now=T0 + timedelta(seconds=30), deadline=DEADLINE) == {action: "failed"}


def test_a_row_of_a_kind_the_table_no_longer_knows_does_not_stop_operators(client: TestClient) -> None:
    # An older control plane's kind, left by a downgrade or a hand edit: listed as unreadable, counted for the
    # guardrails as it was stored, and operators' requests and the guard state still work.
    with session_scope(_sessions(client)) as session:
        _seed(session)
        old = records.create(session=session, proposal=proposal(p.RestartPayload()), now=T0, state=S.PROPOSED,
                             requested_by="test", policy="old-policy", guardrails=[]).id
        session.execute(text("UPDATE actions SET kind = 'set_max_num_seqs' WHERE id = :id"), {"id": old})
    asked = client.post("/v1/replicas/gpu-a/r1/actions", json={"kind": "restart"})
    assert asked.status_code == 201, asked.text
    listed = {a["id"]: a for a in client.get("/v1/actions").json()}
    assert "set_max_num_seqs" in listed[old]["problem"]
    with session_scope(_sessions(client)) as session:
        [record] = [r for r in records.guard_state(session=session, now=T0).records if r.policy == "old-policy"]
        assert record.disruptive  # as stored: a restart's row


def test_the_operator_api_asks_the_table_who_may_request_a_kind() -> None:
    from fastapi import HTTPException

    from controlplane.api.actions import _check_kind
    from controlplane.security.roles import Principal, Role

    operator, viewer = Principal("ops", Role.OPERATOR), Principal("look", Role.VIEWER)
    _check_kind(operator, "drain")  # an operator's kind: allowed
    _check_kind(operator, "lower_max_num_seqs")  # through the model endpoint, as a canary
    for who, kind, words in ((operator, "planned_restart", "policies only"), (viewer, "restart", "operator role")):
        with pytest.raises(HTTPException) as refused:
            _check_kind(who, kind)
        assert refused.value.status_code == 403 and words in str(refused.value.detail)
