"""The one executor: turns approved actions into desired-state changes, then judges them by what agents report.

``apply_action`` claims an approved action (approved -> running, conditional on the old state, so it happens
once however many control planes try) and writes the desired state in the same transaction:
restart -> generation + 1 with the same args; set_flags / lower_max_num_seqs / add_engine_flag -> generation + 1
with new args;
drain -> enabled false; cordon / uncordon -> the node's ``cordoned`` flag, or with ``scope: gpu`` one index in
its ``cordoned_gpus``, which the agent reads in its ``DesiredState``; alert -> an alert row with a pending
delivery. Rolling restarts, multi-replica argument changes and canaries are rollouts (``rollout.py``),
advanced one batch per round from state kept in the row. A restart first captures the replica's log tail and
asks the agent for a stack dump of the engine it replaces (``stackdumps.py``), attached when the agent's
report brings it. A planned restart waits in ``approved`` until its ``not_before``. ``reconcile`` marks
running actions succeeded (every replica READY at the desired generation, or stopped for a drain) or failed
(FATAL, or past the deadline). Both are functions of a session and ``now``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agent.wire import ReplicaState
from controlplane.fleet.desired import DesiredChange, set_desired
from controlplane.remediation import rollout, stackdumps
from controlplane.remediation.alerting import raise_alert
from controlplane.remediation.records import transition
from controlplane.remediation.rollout import RolloutSettings
from controlplane.store.db import session_scope
from controlplane.store.models import ActionRow, Node, Replica

RESTARTS = frozenset({"restart", "planned_restart"})
NEW_ARGS = frozenset({"set_flags", "lower_max_num_seqs", "raise_max_num_seqs", "add_engine_flag"})
INSTANT = frozenset({"cordon", "uncordon", "alert"})
# A drained replica counts as stopped once the agent reports one of these (or stops listing it).
STOPPED = frozenset({ReplicaState.STOPPED.value})


def _split(key: str) -> tuple[str, str]:
    node, _, name = key.partition("/")
    return node, name


def _args_for(row: ActionRow, key: str) -> list[str] | None:
    args: Any = row.params.get("engine_args")
    if isinstance(args, dict):  # the governor gives per-replica arguments, keyed node/replica
        args = args.get(key)
    return None if args is None else [str(a) for a in args]


def _capture(session: Session, row: ActionRow) -> None:
    """Keep what a restart destroys: the last reported log tail of each replica, before the new generation."""
    captured = {}
    for key in row.replicas:
        replica = session.get(Replica, _split(key))
        captured[key] = {"log_tail": [] if replica is None else list(replica.log_tail)[-50:],
                         "state": None if replica is None else replica.state, "stack_dump": None,
                         "stack_dump_note": stackdumps.PENDING}
    row.params = {**row.params, "captured": captured}


def _apply_replicas(session: Session, row: ActionRow, now: datetime) -> str | None:
    """Write the desired change for each replica; return why it cannot be applied, or None."""
    applied: dict[str, int | None] = {}
    if row.kind in RESTARTS:
        _capture(session, row)
    for key in row.replicas:
        node, name = _split(key)
        if row.kind in RESTARTS:
            change = DesiredChange(restart=True, enabled=True)
        elif row.kind in NEW_ARGS:
            args = _args_for(row, key)
            if args is None:
                return f"no engine_args for {key}"
            change = DesiredChange(engine_args=args, enabled=True)
        else:  # drain
            change = DesiredChange(enabled=False)
        out = set_desired(session=session, node=node, name=name, change=change, now=now)
        if row.kind in RESTARTS:
            stackdumps.request(session=session, node=node, name=name, generation=out.generation)
        applied[key] = None if row.kind == "drain" else out.generation
    row.params = {**row.params, "applied": applied}
    if len(applied) == 1:
        row.expected_generation = next(iter(applied.values()))
    return None


def _apply_node(session: Session, row: ActionRow, now: datetime) -> str | None:
    if row.kind == "alert":
        raise_alert(session=session, action=row, now=now)  # delivery belongs to the notifier
        return None
    # Locked: GPU cordons read-modify-write the node's list, and an operator's request (applied at once by the
    # API) may race the leader's executor on the same node.
    node = session.get(Node, row.node, with_for_update=True) if row.node else None
    if node is None:
        return f"no node named {row.node!r}"
    if row.params.get("scope") != "gpu":
        node.cordoned = row.kind == "cordon"
        return None
    gpu = _gpu_of(row)
    if gpu is None:
        return "a GPU cordon names no GPU index"
    # Only this GPU's replicas drain (the agent matches them by their ``gpus``); the node keeps the rest.
    fenced = set(node.cordoned_gpus or [])
    fenced = fenced | {gpu} if row.kind == "cordon" else fenced - {gpu}
    node.cordoned_gpus = sorted(fenced)
    return None


def _gpu_of(row: ActionRow) -> int | None:
    """The GPU index of a GPU-scoped cordon: ``params["gpu"]``, else the target key ``gpu:node/index``."""
    gpu = row.params.get("gpu")
    if gpu is None and row.target_kind == "gpu":
        gpu = row.target.rpartition("/")[2]
    try:
        return None if gpu is None else int(gpu)
    except ValueError:
        return None


def apply_action(*, session: Session, action_id: int, now: datetime) -> bool:
    """Claim and apply one approved action; False when another executor (or an earlier call) already did."""
    if not transition(session=session, action_id=action_id, src="approved", dst="running", now=now, started_at=now):
        return False
    row = session.get(ActionRow, action_id, populate_existing=True)
    assert row is not None
    if row.kind in INSTANT:
        problem = _apply_node(session, row, now)
    elif rollout.is_rollout(row):
        rollout.start(session=session, row=row, now=now)
        problem = None
    elif row.kind in RESTARTS | NEW_ARGS | {"drain"}:
        problem = _apply_replicas(session, row, now)
    else:
        problem = f"the executor cannot apply {row.kind!r} yet"
    if problem is not None:
        _finish(row, "failed", problem, now)
    elif row.kind == "alert":
        _finish(row, "succeeded", "alert recorded; delivery pending", now)
    elif row.kind in INSTANT:
        _finish(row, "succeeded", "applied", now)
    return True


def due(row: ActionRow, now: datetime) -> bool:
    """A planned restart waits for its slot (``not_before``); everything else is due at once."""
    not_before = row.params.get("not_before")
    return not_before is None or datetime.fromisoformat(str(not_before)) <= now


def _finish(row: ActionRow, state: str, outcome: str, now: datetime) -> None:
    row.state, row.outcome, row.finished_at, row.updated_at = state, outcome, now, now


def apply_approved(*, sessions: sessionmaker[Session], now: Callable[[], datetime], limit: int = 100) -> list[int]:
    """Apply every approved action, each in its own transaction; return the ids this call applied."""
    with session_scope(sessions) as session:
        moment = now()
        # Filter before limiting: planned restarts waiting for their slot must not crowd out due actions.
        ids = [r.id for r in session.scalars(select(ActionRow).where(ActionRow.state == "approved")
                                             .order_by(ActionRow.id)) if due(r, moment)][:limit]
    done: list[int] = []
    for action_id in ids:
        with session_scope(sessions) as session:
            if apply_action(session=session, action_id=action_id, now=now()):
                done.append(action_id)
    return done


def judge(row: ActionRow, replicas: dict[str, Replica | None], now: datetime,
          deadline: timedelta) -> tuple[str, str] | None:
    """Pure: (final state, outcome) for a running action given the replicas as last reported, or None."""
    applied: dict[str, Any] = row.params.get("applied", {})
    pending = []
    for key, generation in applied.items():
        replica = replicas.get(key)
        if replica is not None and replica.state == ReplicaState.FATAL.value:
            return "failed", f"{key} is FATAL (exit code {replica.last_exit_code})"
        if generation is None:  # drain
            done = replica is None or replica.state in STOPPED
        else:
            done = (replica is not None and replica.generation >= generation
                    and replica.state == ReplicaState.READY.value and replica.ready)
        if not done:
            pending.append(key)
    if not pending:
        return "succeeded", "every replica converged" if applied else "nothing to do"
    if row.started_at is not None and now - row.started_at > deadline:
        return "failed", f"deadline of {deadline.total_seconds():g}s passed; waiting on {', '.join(pending)}"
    return None


def reconcile(*, session: Session, now: datetime, deadline: timedelta,
              settings: RolloutSettings | None = None) -> dict[int, str]:
    """Finish running actions whose replicas converged or failed, advance rollouts; {action id: new state}."""
    settings = settings or RolloutSettings(deadline=deadline)
    finished: dict[int, str] = {}
    for row in session.scalars(select(ActionRow).where(ActionRow.state == "running").order_by(ActionRow.id)).all():
        if rollout.is_rollout(row):
            verdict = rollout.advance(session=session, row=row, now=now, settings=settings)
            if verdict is not None and transition(session=session, action_id=row.id, src="running",
                                                  dst=verdict[0], now=now, finished_at=now, outcome=verdict[1]):
                finished[row.id] = verdict[0]
            continue
        keys = list(row.params.get("applied", {}))
        replicas = {k: session.get(Replica, _split(k)) for k in keys}
        verdict = judge(row, replicas, now, deadline)
        # Dumps that arrived are attached every round; a finished restart says where none came.
        stackdumps.attach(session=session, row=row, final=verdict is not None)
        if verdict is not None and transition(session=session, action_id=row.id, src="running", dst=verdict[0],
                                              now=now, finished_at=now, outcome=verdict[1]):
            finished[row.id] = verdict[0]
    return finished
