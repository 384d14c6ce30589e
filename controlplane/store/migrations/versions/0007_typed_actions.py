"""Typed actions: every action's trail of state changes, and stored payloads in the shapes of ``policy.payloads``.

Payloads are validated on the way out of the store now (one model per kind, no extra keys), so a row written
by an older version must be brought to its kind's shape here or it would be reported unreadable. The
transforms are plain dict code on purpose: the application's models will change again, and this revision
must keep converting the rows that existed when it was written. The field lists below mirror
``policy.payloads`` as of this revision.

Upgrade, per row (in batches, so a large table is never loaded at once):

- keys the kind's payload does not have are dropped (a restart's ``drain`` and ``engine_args``, which no code
  ever read; a planned restart's ``engine_args``), and so are None values, except where null means something
  (an engine flag rung's ``value``: a switch; a captured ``stack_dump`` or ``state`` that never came);
- the same inside the nested parts: a canary's ``judge`` (e.g. a null ``max_throughput_drop``: the policy set
  none), a ``rollout`` plan and its ``canary_verdict``, each replica's ``captured`` record;
- an operator's ``set_flags`` kept one argument list; it becomes a dict keyed by the replica it is for
  (``replicas[0]``, else the row's node and replica). A row naming no replica keeps its list and is reported
  unreadable rather than given an empty dict, which would restart the replica with its current arguments.

A row already in its kind's shape comes out unchanged, and a row of an unknown kind is left alone.

Every existing row also gets a best-effort trail, by ``migration`` with the cause "recorded before the action
trail existed", built from its columns alone since the older version kept no history: created at
``created_at`` in the state it most likely started in (proposed, approved, suppressed and shadow as stored;
proposed for a rejected row, and for one whose first guardrail decision was "awaiting_approval" and was not
bypassed with force; succeeded for the circuit breaker's page, which was recorded done at once; approved for
the rest), then for one proposed first its approval (at ``updated_at`` while still approved, else at
``started_at``: the API applies an approval at once), approved -> running at ``started_at``, and running ->
its final state at ``finished_at`` (proposed -> rejected at ``finished_at`` for a rejected one). A missing
time falls back to another the row has (``started_at`` to ``created_at``, ``finished_at`` to ``updated_at``),
so every trail is a path the lifecycle allows, ending in the row's state.

Downgrade converts back to what the previous version reads: ``set_flags`` gets its one replica's list again
and a restart gets ``"drain": true`` (the older code never read it, so its lost value does not matter). What
cannot be restored: the ``engine_args`` a restart or planned restart carried (the arguments at proposal time)
and a restart's original ``drain`` value; the older executor restarted with the replica's desired arguments
and read neither key (its ``_args_for`` ran only for set_flags and the governed kinds), so their absence is
harmless. Dropped unknown and None-valued keys are not restored either: the older code read them with
``.get`` or not at all. An ``expired`` action, a state the older guardrails do not know (their record status
would not validate), goes back as ``rejected``. The trail itself is dropped with its table; a new upgrade
backfills it again from the columns.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BATCH = 500
BY = "migration"
BACKFILLED = "recorded before the action trail existed"

# The payload fields of each kind (``policy.payloads`` at this revision) and those whose null is a value.
_COMMON = frozenset({"runbook_url"})
_APPLIED = _COMMON | {"applied"}
_RESTARTS = _APPLIED | {"captured"}
_NEW_ARGS = _APPLIED | {"engine_args", "canary", "judge", "rollout"}
_MAX_NUM_SEQS = _NEW_ARGS | {"max_num_seqs", "previous"}
_CORDON = _COMMON | {"scope", "gpu"}
FIELDS: dict[str, frozenset[str]] = {
    "restart": _RESTARTS,
    "planned_restart": _RESTARTS | {"within_seconds", "not_before", "deadline", "schedule"},
    "drain": _APPLIED,
    "rolling_restart": _COMMON | {"batch_size", "rollout"},
    "set_flags": _NEW_ARGS,
    "lower_max_num_seqs": _MAX_NUM_SEQS,
    "raise_max_num_seqs": _MAX_NUM_SEQS,
    "add_engine_flag": _NEW_ARGS | {"flag", "value", "rung", "multi_gpu", "max_num_seqs"},
    "cordon": _CORDON,
    "uncordon": _CORDON,
    "alert": _COMMON | {"severity", "governed"},
}
NULLABLE: dict[str, frozenset[str]] = {"add_engine_flag": frozenset({"value"})}
_JUDGE = frozenset({"latencies", "max_throughput_drop", "min_latency_gain", "baseline"})
_PLAN = frozenset({"phase", "queue", "done", "batch", "batch_started_at", "waiting", "canary", "previous_args",
                   "canary_ready_at", "canary_verdict", "baseline"})
_VERDICT = frozenset({"verdict", "reason", "figures"})
_CAPTURED = frozenset({"log_tail", "state", "stack_dump", "stack_dump_note"})
_CAPTURED_NULLABLE = frozenset({"state", "stack_dump"})

# States past approval: the executor claimed the action (approved -> running), and maybe finished it.
_STARTED = frozenset({"running", "succeeded", "failed", "rolled_back"})
_FINISHED = frozenset({"succeeded", "failed", "rolled_back"})

_actions = sa.table(
    "actions",
    sa.column("id", sa.Integer()),
    sa.column("kind", sa.String()),
    sa.column("target_kind", sa.String()),
    sa.column("node", sa.String()),
    sa.column("replica", sa.String()),
    sa.column("params", sa.JSON()),
    sa.column("state", sa.String()),
    sa.column("reason", sa.Text()),
    sa.column("guardrails", sa.JSON()),
    sa.column("replicas", sa.JSON()),
    sa.column("approved_by", sa.String()),
    sa.column("created_at", sa.DateTime()),
    sa.column("updated_at", sa.DateTime()),
    sa.column("started_at", sa.DateTime()),
    sa.column("finished_at", sa.DateTime()),
)
_transitions = sa.table(
    "action_transitions",
    sa.column("action_id", sa.Integer()),
    sa.column("at", sa.DateTime()),
    sa.column("from_state", sa.String()),
    sa.column("to_state", sa.String()),
    sa.column("by", sa.String()),
    sa.column("cause", sa.Text()),
)


def _keep(data: Mapping[str, Any], fields: frozenset[str], nullable: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``data`` with only ``fields``, and None values only where ``nullable`` says null is a value."""
    return {k: v for k, v in data.items() if k in fields and (v is not None or k in nullable)}


def replica_key(row: Mapping[str, Any]) -> str | None:
    """The ``node/replica`` an operator's one-replica action is for."""
    replicas = row.get("replicas")
    if isinstance(replicas, list) and replicas and isinstance(replicas[0], str):
        return replicas[0]
    if row.get("node") and row.get("replica"):
        return f"{row['node']}/{row['replica']}"
    return None


def upgrade_params(kind: str, params: Any, key: str | None) -> Any:
    """One stored payload in its kind's current shape (``key``: the replica an operator's set_flags is for)."""
    fields = FIELDS.get(kind)
    if fields is None or not isinstance(params, dict):
        return params
    out = _keep(params, fields, NULLABLE.get(kind, frozenset()))
    if kind == "set_flags" and isinstance(out.get("engine_args"), list) and key is not None:
        out["engine_args"] = {key: out["engine_args"]}
    if isinstance(out.get("judge"), dict):
        out["judge"] = _keep(out["judge"], _JUDGE)
    if isinstance(out.get("rollout"), dict):
        plan = _keep(out["rollout"], _PLAN)
        if isinstance(plan.get("canary_verdict"), dict):
            plan["canary_verdict"] = _keep(plan["canary_verdict"], _VERDICT)
        out["rollout"] = plan
    if isinstance(out.get("captured"), dict):
        out["captured"] = {k: _keep(v, _CAPTURED, _CAPTURED_NULLABLE) if isinstance(v, dict) else v
                           for k, v in out["captured"].items()}
    return out


def downgrade_params(kind: str, params: Any, key: str | None) -> Any:
    """One stored payload in the shape the previous version wrote."""
    if not isinstance(params, dict):
        return params
    out = dict(params)
    args = out.get("engine_args")
    if kind == "set_flags" and isinstance(args, dict):
        # The older executor also read a dict by replica key, so one with several entries can stay as it is.
        if key is not None and key in args:
            out["engine_args"] = args[key]
        elif len(args) == 1:
            out["engine_args"] = next(iter(args.values()))
    if kind == "restart":
        out["drain"] = True
    return out


def _first_verdict(guardrails: Any) -> tuple[str | None, str]:
    if isinstance(guardrails, list) and guardrails and isinstance(guardrails[0], dict):
        return guardrails[0].get("verdict"), str(guardrails[0].get("reason") or "")
    return None, ""


def backfill_trail(row: Mapping[str, Any]) -> list[tuple[datetime, str | None, str]]:
    """(at, from, to) for each line of a best-effort trail of one existing row, ending in its state."""
    state: str = row["state"]
    created: datetime = row["created_at"]
    started: datetime = row["started_at"] or created
    finished: datetime = row["finished_at"] or row["updated_at"] or started
    breaker_page = (row["kind"] == "alert" and row["target_kind"] == "fleet" and state == "succeeded"
                    and row["started_at"] == created and row["approved_by"] is None)
    if breaker_page:
        return [(created, None, "succeeded")]
    if state in ("rejected", "expired"):
        return [(created, None, "proposed"), (finished, "proposed", state)]
    if state not in _STARTED and state != "approved":
        return [(created, None, state)]  # proposed, suppressed, shadow: still where they were created
    verdict, reason = _first_verdict(row["guardrails"])
    if verdict == "awaiting_approval" and not reason.endswith("with force)"):
        approved_at = row["updated_at"] if state == "approved" else started
        lines: list[tuple[datetime, str | None, str]] = [(created, None, "proposed"),
                                                          (approved_at, "proposed", "approved")]
    else:
        lines = [(created, None, "approved")]
    if state in _STARTED:
        lines.append((started, "approved", "running"))
    if state in _FINISHED:
        lines.append((finished, "running", state))
    return lines


def _batches(connection: Connection, columns: Sequence[sa.ColumnElement[Any]]) -> Iterator[list[dict[str, Any]]]:
    """Every action row, ``BATCH`` at a time in id order (keyset paging: rows updated meanwhile are not re-read)."""
    last = 0
    while True:
        result = connection.execute(sa.select(*columns).where(_actions.c.id > last)
                                    .order_by(_actions.c.id).limit(BATCH)).mappings()
        rows = [{str(k): v for k, v in r.items()} for r in result]
        if not rows:
            return
        yield rows
        last = rows[-1]["id"]


_SET_PARAMS = (_actions.update().where(_actions.c.id == sa.bindparam("row_id"))
               .values(params=sa.bindparam("new_params", type_=sa.JSON())))


def upgrade() -> None:
    op.create_table(
        "action_transitions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("action_id", sa.Integer(), sa.ForeignKey("actions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("by", sa.String(128), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
    )
    op.create_index("ix_action_transitions_action_id", "action_transitions", ["action_id"])

    connection = op.get_bind()
    c = _actions.c
    columns = [c.id, c.kind, c.target_kind, c.node, c.replica, c.params, c.state, c.guardrails, c.replicas,
               c.approved_by, c.created_at, c.updated_at, c.started_at, c.finished_at]
    for rows in _batches(connection, columns):
        changed = []
        trail = []
        for row in rows:
            params = upgrade_params(row["kind"], row["params"], replica_key(row))
            if params != row["params"]:
                changed.append({"row_id": row["id"], "new_params": params})
            trail += [{"action_id": row["id"], "at": at, "from_state": src, "to_state": dst, "by": BY,
                       "cause": BACKFILLED} for at, src, dst in backfill_trail(row)]
        if changed:
            connection.execute(_SET_PARAMS, changed)
        if trail:
            connection.execute(_transitions.insert(), trail)


def downgrade() -> None:
    connection = op.get_bind()
    c = _actions.c
    for rows in _batches(connection, [c.id, c.kind, c.node, c.replica, c.params, c.replicas]):
        changed = []
        for row in rows:
            params = downgrade_params(row["kind"], row["params"], replica_key(row))
            if params != row["params"]:
                changed.append({"row_id": row["id"], "new_params": params})
        if changed:
            connection.execute(_SET_PARAMS, changed)
    connection.execute(_actions.update().where(c.state == "expired").values(state="rejected"))

    op.drop_index("ix_action_transitions_action_id", table_name="action_transitions")
    op.drop_table("action_transitions")
