"""Revision 0007 on a store with actions in them: every old payload shape comes out in its kind's typed shape,
every row gets a trail that ends in its state, and the way back down restores what the older code read.

The rows are what the previous version wrote (``git show 433838f``: the loop, the executor, the rollout, the
governor, the flag rungs and the operator), inserted at revision 0006 with plain SQL so that no current model
shapes them. Runs on SQLite, and on a real PostgreSQL with ``-m slow``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, inspect

from controlplane.policy import payloads as p
from controlplane.policy.lifecycle import ActionState, check_transition
from controlplane.policy.payloads import parse_payload, payload_json
from controlplane.store.db import MIGRATIONS_DIR, current_revision, downgrade, make_engine, migrate

T0 = datetime(2026, 11, 29, 12, 0, 0)  # stored naive, as DateTime columns hold it
ISO = "2026-11-29T12:00:05+00:00"
BACKFILLED = "recorded before the action trail existed"
MIGRATION = MIGRATIONS_DIR / "versions" / "0007_typed_actions.py"
NONE_ARRIVED = ("no stack dump arrived: the agent predates stack dumps, or the engine was not running when "
                "the restart reached it")
PENDING = "waiting for the agent's stack dump (py-spy) of the replaced engine"
ARGS = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "9001", "--max-num-seqs", "64"]
ALLOWED = [{"verdict": "allowed", "guardrail": None, "reason": "all guardrails passed"}]
AWAITING = [{"verdict": "awaiting_approval", "guardrail": "approval",
             "reason": "policy requires approval: proposed, waiting for an operator"}]

actions = sa.table(
    "actions",
    *(sa.column(name, sa.String()) for name in ("kind", "target_kind", "target", "node", "replica", "model",
                                                "state", "reason", "policy", "requested_by", "approved_by",
                                                "outcome")),
    sa.column("id", sa.Integer()),
    sa.column("params", sa.JSON()),
    sa.column("evidence", sa.JSON()),
    sa.column("guardrails", sa.JSON()),
    sa.column("replicas", sa.JSON()),
    sa.column("disruptive", sa.Boolean()),
    sa.column("expected_generation", sa.Integer()),
    *(sa.column(name, sa.DateTime()) for name in ("created_at", "updated_at", "started_at", "finished_at")),
)
transitions = sa.table(
    "action_transitions",
    sa.column("id", sa.Integer()),
    sa.column("action_id", sa.Integer()),
    sa.column("at", sa.DateTime()),
    sa.column("from_state", sa.String()),
    sa.column("to_state", sa.String()),
    sa.column("by", sa.String()),
    sa.column("cause", sa.Text()),
)


@dataclass
class Old:
    """One action row as the previous version stored it, and the trail the migration should give it."""

    kind: str
    state: str
    params: dict[str, Any]
    trail: list[tuple[str | None, str]]
    target_kind: str = "replica"
    target: str = "replica:gpu-a/r0"
    node: str | None = "gpu-a"
    replica: str | None = "r0"
    replicas: list[str] = field(default_factory=lambda: ["gpu-a/r0"])
    policy: str | None = "ttft-slo"
    requested_by: str = "policy"
    approved_by: str | None = None
    guardrails: list[dict[str, Any]] = field(default_factory=lambda: list(ALLOWED))
    started: float | None = None  # seconds after created_at
    finished: float | None = None
    outcome: str = ""

    def values(self, created: datetime) -> dict[str, Any]:
        def at(seconds: float | None) -> datetime | None:
            return None if seconds is None else created + timedelta(seconds=seconds)

        last = max(s for s in (0.0, self.started, self.finished) if s is not None)
        return dict(kind=self.kind, target_kind=self.target_kind, target=self.target, node=self.node,
                    replica=self.replica, model=None if self.target_kind == "fleet" else "llama-8b",
                    params=self.params, state=self.state, reason=f"{self.kind} for the test", policy=self.policy,
                    evidence=[], guardrails=self.guardrails, replicas=self.replicas,
                    disruptive=self.kind not in ("alert", "uncordon"), expected_generation=None,
                    requested_by=self.requested_by, approved_by=self.approved_by, created_at=created,
                    updated_at=at(last), started_at=at(self.started), finished_at=at(self.finished),
                    outcome=self.outcome)


_RUN = [(None, "approved"), ("approved", "running")]


def old_rows() -> dict[str, Old]:
    """Every old payload shape, in every state the previous version could store."""
    wedged = {"log_tail": ["INFO engine step 8812", "WARNING no progress for 120s"], "state": "WEDGED",
              "stack_dump": None, "stack_dump_note": NONE_ARRIVED}
    canary_plan = {"phase": "canary", "queue": [], "done": [], "canary": "gpu-a/r0", "previous_args": ARGS,
                   "batch": {"gpu-a/r0": 7}, "batch_started_at": ISO, "canary_ready_at": "2026-11-29T12:01:30+00:00",
                   "canary_verdict": {"verdict": "wait", "reason": "not enough readings yet",
                                      "figures": {"canary_itl_p99_seconds": 0.041, "peers_itl_p99_seconds": None}},
                   "baseline": ["gpu-b/r0"]}
    return {
        # The stall policy's restart: drain and the arguments at proposal time, a dump that never came.
        "restart_stall": Old("restart", "succeeded", {
            "drain": True, "engine_args": ARGS, "runbook_url": "https://runbooks.example/stall.md",
            "captured": {"gpu-a/r0": wedged}, "applied": {"gpu-a/r0": 4}},
            [*_RUN, ("running", "succeeded")], policy="stall", started=1, finished=95,
            outcome="every replica converged"),
        # An operator's restart, still waiting for the agent's dump.
        "restart_operator": Old("restart", "running", {
            "captured": {"gpu-a/r0": {"log_tail": [], "state": "READY", "stack_dump": None,
                                      "stack_dump_note": PENDING}}, "applied": {"gpu-a/r0": 5}},
            _RUN, policy=None, requested_by="alice", approved_by="alice", started=0),
        # A policy restart an operator approved (the guardrails asked for approval first).
        "restart_approved_by_operator": Old("restart", "failed", {"drain": False, "engine_args": ARGS,
                                                                  "applied": {"gpu-a/r0": 6}},
            [(None, "proposed"), ("proposed", "approved"), ("approved", "running"), ("running", "failed")],
            guardrails=AWAITING, approved_by="bob", started=300, finished=900,
            outcome="deadline of 600s passed; waiting on gpu-a/r0"),
        "restart_rejected": Old("restart", "rejected", {"drain": True, "engine_args": ARGS},
                                [(None, "proposed"), ("proposed", "rejected")], guardrails=AWAITING,
                                approved_by="bob", finished=60, outcome="rejected by bob: not now"),
        "planned_restart": Old("planned_restart", "approved", {
            "within_seconds": 3600.0, "engine_args": ARGS, "runbook_url": "https://runbooks.example/leak.md",
            "not_before": "2026-11-29T14:00:00+00:00", "deadline": "2026-11-29T14:30:00+00:00",
            "schedule": "quietest forecast moment before 2026-11-29T14:30:00+00:00: 2026-11-29T14:00:00+00:00"},
            [(None, "approved")], policy="rss-leak"),
        # An operator's drain: its applied generation is None (stopped), which must stay.
        "drain": Old("drain", "succeeded", {"applied": {"gpu-b/r1": None}}, [*_RUN, ("running", "succeeded")],
                     target="replica:gpu-b/r1", node="gpu-b", replica="r1", replicas=["gpu-b/r1"], policy=None,
                     requested_by="alice", approved_by="alice", started=0, finished=40,
                     outcome="every replica converged"),
        "rolling_restart": Old("rolling_restart", "running", {
            "batch_size": 2, "runbook_url": None, "rollout": {
                "phase": "rolling", "queue": [["gpu-b/r0", "gpu-b/r1"]], "done": ["gpu-a/r0", "gpu-a/r1"],
                "batch": {}, "batch_started_at": ISO,
                "waiting": "waiting: 1 other replica(s) of llama-8b READY, budget needs 2"}},
            _RUN, target_kind="model", target="model:llama-8b", node=None, replica=None,
            replicas=["gpu-a/r0", "gpu-a/r1", "gpu-b/r0", "gpu-b/r1"], policy="xid", started=2),
        # An operator's full argument list for its one replica, as a list.
        "set_flags": Old("set_flags", "failed", {"engine_args": [*ARGS, "--enable-prefix-caching"],
                                                 "applied": {"gpu-a/r1": 3}},
                         [*_RUN, ("running", "failed")], target="replica:gpu-a/r1", replica="r1",
                         replicas=["gpu-a/r1"], policy=None, requested_by="alice", approved_by="alice",
                         started=0, finished=30, outcome="gpu-a/r1 is FATAL (exit code 1)"),
        # A lowering canary that failed its judge, with the governor's null max_throughput_drop.
        "lower_rolled_back": Old("lower_max_num_seqs", "rolled_back", {
            "max_num_seqs": 48, "previous": 64, "engine_args": {"gpu-a/r0": [*ARGS[:-1], "48"]},
            "judge": {"latencies": ["itl_p99_seconds"], "max_throughput_drop": None},
            "runbook_url": "https://runbooks.example/itl.md", "canary": True,
            "rollout": {"phase": "rolled_back", "queue": [], "done": ["gpu-a/r0"], "canary": "gpu-a/r0",
                        "previous_args": ARGS, "batch": {}, "batch_started_at": ISO, "waiting": None,
                        "canary_ready_at": "2026-11-29T12:01:00+00:00",
                        "canary_verdict": {"verdict": "fail", "reason": "canary worse than its peers: itl",
                                           "figures": {"canary_itl_p99_seconds": 0.09,
                                                       "peers_itl_p99_seconds": 0.05}}}},
            [*_RUN, ("running", "rolled_back")], policy="itl-governor", started=1, finished=400,
            outcome="canary worse than its peers: itl; gpu-a/r0 rolled back to --max-num-seqs 64"),
        # A promotion to the model (no canary key) that the policy holds for approval.
        "raise_proposed": Old("raise_max_num_seqs", "proposed", {
            "max_num_seqs": 64, "previous": 48, "engine_args": {"gpu-a/r0": ARGS, "gpu-b/r0": ARGS},
            "judge": {"latencies": ["itl_p99_seconds"], "max_throughput_drop": 0.2}},
            [(None, "proposed")], target_kind="model", target="model:llama-8b", node=None, replica=None,
            replicas=["gpu-a/r0", "gpu-b/r0"], policy="itl-governor", guardrails=AWAITING),
        # A flag rung mid-canary: a switch (value null), judged against like-for-like peers.
        "flag_rung_canary": Old("add_engine_flag", "running", {
            "flag": "--disable-custom-all-reduce", "value": None, "rung": 1, "multi_gpu": True,
            "max_num_seqs": 16, "engine_args": {"gpu-a/r0": [*ARGS, "--disable-custom-all-reduce"]},
            "judge": {"latencies": ["itl_p99_seconds"], "max_throughput_drop": None, "min_latency_gain": 0.05,
                      "baseline": "same_args"},
            "runbook_url": "https://runbooks.example/itl.md", "canary": True, "rollout": canary_plan},
            _RUN, policy="itl-governor", started=5),
        "cordon_gpu_shadow": Old("cordon", "shadow", {"scope": "gpu", "gpu": 3}, [(None, "shadow")],
                                 target_kind="gpu", target="gpu:gpu-a/3", replica=None, replicas=[],
                                 policy="xid", guardrails=[{"verdict": "shadow", "guardrail": "dry_run",
                                                            "reason": "dry run"}]),
        "cordon_node_suppressed": Old("cordon", "suppressed", {"scope": "node"}, [(None, "suppressed")],
                                      target_kind="node", target="node:gpu-a", replica=None, replicas=[],
                                      policy="thermal",
                                      guardrails=[{"verdict": "suppressed", "guardrail": "rate_limit",
                                                   "reason": "3 disruptive actions in the last hour"}]),
        "uncordon": Old("uncordon", "succeeded", {"scope": "gpu", "gpu": 3}, [*_RUN, ("running", "succeeded")],
                        target_kind="gpu", target="gpu:gpu-a/3", replica=None, replicas=[], policy=None,
                        requested_by="alice", approved_by="alice", started=0, finished=0, outcome="applied"),
        # The circuit breaker's page: recorded succeeded at once, never approved.
        "breaker_page": Old("alert", "succeeded", {"severity": "page"}, [(None, "succeeded")], target_kind="fleet",
                            target="fleet", node=None, replica=None, replicas=[], policy="circuit-breaker",
                            guardrails=[], started=0, finished=0, outcome="alert recorded; delivery pending"),
        "governed_alert": Old("alert", "succeeded", {"severity": "warning", "governed": True,
                                                     "runbook_url": "https://runbooks.example/itl.md"},
                              [*_RUN, ("running", "succeeded")], policy="itl-governor", replicas=[], started=2,
                              finished=2, outcome="alert recorded; delivery pending"),
    }


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    try:
        yield engine
    finally:
        engine.dispose()


def _insert(engine: Engine, rows: dict[str, Old]) -> dict[str, int]:
    ids = {}
    with engine.begin() as conn:
        for n, (name, row) in enumerate(rows.items()):
            ids[name] = conn.execute(actions.insert().values(**row.values(T0 + timedelta(minutes=n)))
                                     .returning(actions.c.id)).scalar_one()
    return ids


def _rows(engine: Engine) -> dict[int, dict[str, Any]]:
    with engine.connect() as conn:
        return {r["id"]: dict(r) for r in conn.execute(sa.select(actions)).mappings()}


def _trails(engine: Engine) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    with engine.connect() as conn:
        for t in conn.execute(sa.select(transitions).order_by(transitions.c.id)).mappings():
            out.setdefault(t["action_id"], []).append(dict(t))
    return out


def _assert_upgraded(engine: Engine, rows: dict[str, Old], ids: dict[str, int]) -> None:
    stored, trails = _rows(engine), _trails(engine)
    for name, old in rows.items():
        row = stored[ids[name]]
        parse_payload(row["kind"], row["params"])  # raises CorruptPayload, naming the row's problem
        trail = trails[ids[name]]
        assert [(t["from_state"], t["to_state"]) for t in trail] == old.trail, name
        assert trail[-1]["to_state"] == row["state"], name
        previous: ActionState | None = None
        for t in trail:
            assert (t["by"], t["cause"]) == ("migration", BACKFILLED)
            src = None if t["from_state"] is None else ActionState(t["from_state"])
            assert src == previous, name
            check_transition(src, ActionState(t["to_state"]))
            previous = ActionState(t["to_state"])
        assert trail[0]["at"] == row["created_at"], name
        if row["started_at"] is not None and old.trail[-1] != (None, "succeeded"):
            assert [t["at"] for t in trail if t["to_state"] == "running"] == [row["started_at"]], name
        if len(trail) > 1 and row["finished_at"] is not None:
            assert trail[-1]["at"] == row["finished_at"], name


def test_0007_types_every_old_shape_gives_each_row_a_trail_and_goes_back_down(engine: Engine) -> None:
    migrate(engine, "0006")
    rows = old_rows()
    ids = _insert(engine, rows)
    migrate(engine, "0007")
    assert current_revision(engine) == "0007"
    _assert_upgraded(engine, rows, ids)
    params = {name: _rows(engine)[ids[name]]["params"] for name in rows}

    # Keys the kind never had, and the restart's proposal-time arguments, are gone; meaningful nulls stay.
    assert params["restart_stall"] == {"runbook_url": "https://runbooks.example/stall.md",
                                       "captured": rows["restart_stall"].params["captured"],
                                       "applied": {"gpu-a/r0": 4}}
    assert params["restart_stall"]["captured"]["gpu-a/r0"]["stack_dump"] is None
    assert "drain" not in params["restart_rejected"] and "engine_args" not in params["restart_rejected"]
    assert "engine_args" not in params["planned_restart"]
    assert params["planned_restart"]["not_before"] == "2026-11-29T14:00:00+00:00"
    assert params["set_flags"]["engine_args"] == {"gpu-a/r1": [*ARGS, "--enable-prefix-caching"]}
    assert params["drain"] == {"applied": {"gpu-b/r1": None}}
    assert params["flag_rung_canary"]["value"] is None
    assert params["flag_rung_canary"]["judge"] == {"latencies": ["itl_p99_seconds"], "min_latency_gain": 0.05,
                                                   "baseline": "same_args"}
    assert params["flag_rung_canary"]["rollout"] == rows["flag_rung_canary"].params["rollout"]
    assert params["lower_rolled_back"]["judge"] == {"latencies": ["itl_p99_seconds"]}
    assert "waiting" not in params["lower_rolled_back"]["rollout"]
    assert params["rolling_restart"] == {"batch_size": 2, "rollout": rows["rolling_restart"].params["rollout"]}
    assert params["breaker_page"] == {"severity": "page"}
    typed = parse_payload("add_engine_flag", params["flag_rung_canary"])
    assert isinstance(typed, p.AddEngineFlagPayload) and typed.change == "--disable-custom-all-reduce"
    assert typed.rollout is not None and typed.rollout.canary_verdict is not None
    assert typed.rollout.baseline == ["gpu-b/r0"]

    downgrade(engine, "0006")
    assert current_revision(engine) == "0006"
    assert "action_transitions" not in inspect(engine).get_table_names()
    down = {name: _rows(engine)[ids[name]]["params"] for name in rows}
    assert down["set_flags"]["engine_args"] == [*ARGS, "--enable-prefix-caching"]
    for name in ("restart_stall", "restart_operator", "restart_approved_by_operator", "restart_rejected"):
        assert down[name]["drain"] is True, name
        assert "engine_args" not in down[name], name  # not restorable, and never read by the older code
    assert down["flag_rung_canary"] == {k: v for k, v in rows["flag_rung_canary"].params.items() if k != "judge"} \
        | {"judge": params["flag_rung_canary"]["judge"]}
    assert down["drain"] == {"applied": {"gpu-b/r1": None}}
    for name in rows:
        if rows[name].kind not in ("restart", "set_flags"):
            assert down[name] == params[name], name

    # Up again: the same payloads, and the trail backfilled once more.
    migrate(engine, "0007")
    _assert_upgraded(engine, rows, ids)
    assert {name: _rows(engine)[ids[name]]["params"] for name in rows} == params
    assert sum(len(t) for t in _trails(engine).values()) == sum(len(r.trail) for r in rows.values())


def new_shapes() -> dict[str, tuple[str, dict[str, Any]]]:
    """Payloads as the current code stores them (``payload_json``), kind by kind."""
    plan = p.RolloutPlan(phase="canary", canary="gpu-a/r0", previous_args=ARGS, batch={"gpu-a/r0": 7},
                         batch_started_at=datetime.fromisoformat(ISO), baseline="itself before the change",
                         canary_verdict=p.CanaryVerdictRecord(verdict="wait", reason="warming up",
                                                              figures={"canary_ttft_p99_seconds": None}))
    captured = {"gpu-a/r0": p.Captured(log_tail=["INFO x"], state=None, stack_dump=None,
                                       stack_dump_note=PENDING)}
    payloads: dict[str, p._Payload] = {
        "restart": p.RestartPayload(captured=captured, applied={"gpu-a/r0": 2}),
        "planned_restart": p.PlannedRestartPayload(within_seconds=600, not_before=datetime.fromisoformat(ISO),
                                                   schedule="at once"),
        "drain": p.DrainPayload(applied={"gpu-a/r0": None}),
        "rolling_restart": p.RollingRestartPayload(batch_size=2, rollout=p.RolloutPlan(
            phase="rolling", queue=[["gpu-a/r0"]], done=["gpu-a/r1"])),
        "set_flags": p.SetFlagsPayload(engine_args={"gpu-a/r0": ARGS}),
        "lower_max_num_seqs": p.MaxNumSeqsPayload(kind="lower_max_num_seqs", max_num_seqs=32, previous=64,
                                                  engine_args={"gpu-a/r0": ARGS}, canary=True,
                                                  judge=p.Judge(latencies=["itl_p99_seconds"]), rollout=plan),
        "raise_max_num_seqs": p.MaxNumSeqsPayload(kind="raise_max_num_seqs", max_num_seqs=64, previous=32),
        "add_engine_flag": p.AddEngineFlagPayload(flag="--block-size", value=None, rung=2, max_num_seqs=16,
                                                  judge=p.Judge(max_throughput_drop=0.25, baseline="same_args")),
        "cordon": p.CordonPayload(kind="cordon", scope="gpu", gpu=1),
        "uncordon": p.CordonPayload(kind="uncordon"),
        "alert": p.AlertPayload(severity="page", runbook_url="https://runbooks.example/breaker.md"),
    }
    return {kind: (kind, payload_json(payload)) for kind, payload in payloads.items()}


def test_0007_leaves_a_row_already_in_the_typed_shape_unchanged(engine: Engine) -> None:
    migrate(engine, "0006")
    shapes = new_shapes()
    assert shapes["add_engine_flag"][1]["value"] is None  # the switch's null is in the stored form
    rows = {name: Old(kind, "approved", dict(params), [(None, "approved")]) for name, (kind, params) in shapes.items()}
    ids = _insert(engine, rows)
    migrate(engine, "0007")
    stored = _rows(engine)
    for name, (kind, params) in shapes.items():
        assert stored[ids[name]]["params"] == params, name
        parse_payload(kind, stored[ids[name]]["params"])


def test_0007_converts_a_table_larger_than_one_batch(engine: Engine) -> None:
    migrate(engine, "0006")
    count = 1203  # more than two of the migration's batches of 500
    row = Old("set_flags", "succeeded", {"engine_args": ARGS, "applied": {"gpu-a/r0": 2}},
              [*_RUN, ("running", "succeeded")], started=0, finished=20, policy=None, requested_by="alice",
              approved_by="alice")
    with engine.begin() as conn:
        conn.execute(actions.insert(), [row.values(T0 + timedelta(seconds=n)) for n in range(count)])
    migrate(engine, "0007")
    stored, trails = _rows(engine), _trails(engine)
    assert len(stored) == count
    assert all(r["params"]["engine_args"] == {"gpu-a/r0": ARGS} for r in stored.values())
    assert all(len(trails[i]) == 3 and trails[i][-1]["to_state"] == "succeeded" for i in stored)


def test_0007_imports_no_application_code() -> None:
    """The revision must keep converting the rows of its time when the application's models change."""
    tree = ast.parse(MIGRATION.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] in {"controlplane", "agent", "pitstop"}}
