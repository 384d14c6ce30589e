"""The one executor: turns approved actions into desired-state changes, then judges them by what agents report.

``apply_action`` claims an approved action (approved -> running, conditional on the old state, so it happens
once however many control planes try) and writes the desired state in the same transaction. How is the kind's
row of ``policy.kinds``: restarts -> generation + 1 with the same args; new engine arguments -> generation + 1
with them; a drain -> enabled false; cordon / uncordon -> the node's ``cordoned`` flag, or with ``scope: gpu``
one index in its ``cordoned_gpus``, which the agent reads in its ``DesiredState``; alert -> an alert row with
a pending delivery. Rolling restarts, multi-replica argument changes and canaries are rollouts
(``policy.rollout``, stepped once per round by ``rollout.advance``). A restart first captures the replica's
log tail and asks the agent for a stack dump of the engine it replaces (``stackdumps.py``), attached when the
agent's report brings it. A planned restart waits in ``approved`` until its ``not_before``. ``reconcile``
marks running actions succeeded (every replica READY at the desired generation, or stopped for a drain) or
failed (FATAL, or past the deadline). A stored payload that no longer validates fails its action with the
reason; the loop goes on. Both are functions of a session and ``now``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agent.wire import ReplicaState
from controlplane.fleet.desired import DesiredChange, set_desired
from controlplane.policy.kinds import spec
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.live_cap import cap_progress, cap_words, reported
from controlplane.policy.payloads import (
    AddEngineFlagPayload,
    AlertPayload,
    Applied,
    Captured,
    CordonPayload,
    CorruptPayload,
    DrainPayload,
    MaxNumSeqsPayload,
    Payload,
    PlannedRestartPayload,
    RestartPayload,
    RollingRestartPayload,
    SetFlagsPayload,
    SetLiveCapPayload,
)
from controlplane.policy.rollout import RolloutSettings, fatal_reason, is_rollout, progress
from controlplane.policy.snapshot import split_key
from controlplane.remediation import rollout, stackdumps
from controlplane.remediation.alerting import raise_alert
from controlplane.remediation.records import finish, read_payload, transition, write_payload
from controlplane.store.db import session_scope
from controlplane.store.models import ActionRow, Node, Replica

S = ActionState
log = logging.getLogger(__name__)


def _capture(session: Session, row: ActionRow,
             payload: RestartPayload | PlannedRestartPayload) -> RestartPayload | PlannedRestartPayload:
    """Keep what a restart destroys: the last reported log tail of each replica, before the new generation."""
    captured = {}
    for key in row.replicas:
        replica = session.get(Replica, split_key(key))
        captured[key] = Captured(log_tail=[] if replica is None else [str(x) for x in replica.log_tail][-50:],
                                 state=None if replica is None else replica.state, stack_dump=None,
                                 stack_dump_note=stackdumps.PENDING)
    return payload.model_copy(update={"captured": captured})


def _apply_replicas(session: Session, row: ActionRow, payload: Payload, now: datetime) -> str | None:
    """Write the desired change for each replica; return why it cannot be applied, or None."""
    applied: dict[str, int | None] = {}
    if isinstance(payload, RestartPayload | PlannedRestartPayload):
        payload = _capture(session, row, payload)
    for key in row.replicas:
        node, name = split_key(key)
        if isinstance(payload, RestartPayload | PlannedRestartPayload):
            change = DesiredChange(restart=True, enabled=True)
        elif isinstance(payload, DrainPayload):
            change = DesiredChange(enabled=False)
        elif isinstance(payload, SetLiveCapPayload):
            change = DesiredChange(live_cap=payload.live_cap)  # given, even None: it replaces the cap
        elif isinstance(payload, SetFlagsPayload | MaxNumSeqsPayload | AddEngineFlagPayload):
            replica = session.get(Replica, (node, name))
            if key not in payload.engine_args and replica is None:
                return f"no engine_args for {key}"
            current = [] if replica is None else [str(a) for a in replica.engine_args]
            # A new --max-num-seqs is the whole limit: no live cap stays to hold it lower.
            lift = {"live_cap": None} if isinstance(payload, MaxNumSeqsPayload) else {}
            change = DesiredChange(engine_args=payload.args_for(key, current), enabled=True, **lift)
        else:
            return f"the executor cannot apply {row.kind!r} to a replica"
        out = set_desired(session=session, node=node, name=name, change=change, now=now)
        if isinstance(payload, RestartPayload | PlannedRestartPayload):
            stackdumps.request(session=session, node=node, name=name, generation=out.generation)
        applied[key] = None if isinstance(payload, DrainPayload) else out.generation
    if isinstance(payload, Applied):
        write_payload(row, payload.model_copy(update={"applied": applied}), now)
    if len(applied) == 1 and not isinstance(payload, SetLiveCapPayload):  # a live cap makes no new generation
        row.expected_generation = next(iter(applied.values()))
    return None


def _apply_node(session: Session, row: ActionRow, payload: CordonPayload) -> str | None:
    # Locked: GPU cordons read-modify-write the node's list, and an operator's request (applied at once by the
    # API) may race the leader's executor on the same node.
    node = session.get(Node, row.node, with_for_update=True) if row.node else None
    if node is None:
        return f"no node named {row.node!r}"
    fence = payload.kind == "cordon"
    if payload.scope != "gpu":
        node.cordoned = fence
        return None
    gpu = payload.gpu
    if gpu is None and row.target_kind == "gpu":
        gpu = _target_gpu(row.target)
    if gpu is None:
        return "a GPU cordon names no GPU index"
    # Only this GPU's replicas drain (the agent matches them by their ``gpus``); the node keeps the rest.
    fenced = set(node.cordoned_gpus or [])
    node.cordoned_gpus = sorted(fenced | {gpu} if fence else fenced - {gpu})
    return None


def _target_gpu(target: str) -> int | None:
    """The index in a target key ``gpu:node/index``."""
    try:
        return int(split_key(target)[1])
    except ValueError:
        return None


def _fail_corrupt(session: Session, row: ActionRow, problem: CorruptPayload, now: datetime) -> None:
    log.warning("action %s fails: %s", row.id, problem)
    finish(session=session, row=row, dst=S.FAILED, outcome=f"{problem}: the action cannot be applied or judged",
           now=now)


def apply_action(*, session: Session, action_id: int, now: datetime,
                 settings: RolloutSettings | None = None) -> bool:
    """Claim and apply one approved action; False when another executor (or an earlier call) already did."""
    if not transition(session=session, action_id=action_id, src=S.APPROVED, dst=S.RUNNING, now=now,
                      cause="claimed by the executor", started_at=now):
        return False
    row = session.get(ActionRow, action_id, populate_existing=True)
    assert row is not None
    try:
        payload = read_payload(row)
    except CorruptPayload as exc:
        _fail_corrupt(session, row, exc, now)
        return True
    how = spec(payload.kind).apply
    problem: str | None = None
    if isinstance(payload, AlertPayload):
        raise_alert(session=session, action=row, payload=payload, now=now)  # delivery belongs to the notifier
        finish(session=session, row=row, dst=S.SUCCEEDED, outcome="alert recorded; delivery pending", now=now)
        return True
    if isinstance(payload, CordonPayload):
        problem = _apply_node(session, row, payload)
        if problem is None:
            finish(session=session, row=row, dst=S.SUCCEEDED, outcome="applied", now=now)
    elif is_rollout(payload, row.replicas):
        assert isinstance(payload, RollingRestartPayload | SetFlagsPayload | MaxNumSeqsPayload | AddEngineFlagPayload
                          | SetLiveCapPayload)
        rollout.begin(session=session, row=row, payload=payload, now=now)
    elif how in ("desired", "rollout"):
        problem = _apply_replicas(session, row, payload, now)
    else:
        problem = f"the executor cannot apply {row.kind!r} yet"
    if problem is not None:
        finish(session=session, row=row, dst=S.FAILED, outcome=problem, now=now)
    return True


def due(row: ActionRow, now: datetime) -> bool:
    """A planned restart waits for its slot (``not_before``); everything else is due at once (a payload that
    no longer validates too: it is claimed and failed with its reason)."""
    try:
        payload = read_payload(row)
    except CorruptPayload:
        return True
    return not isinstance(payload, PlannedRestartPayload) or payload.not_before is None or payload.not_before <= now


def apply_approved(*, sessions: sessionmaker[Session], now: Callable[[], datetime], limit: int = 100) -> list[int]:
    """Apply every approved action, each in its own transaction; return the ids this call applied."""
    with session_scope(sessions) as session:
        moment = now()
        # Filter before limiting: planned restarts waiting for their slot must not crowd out due actions.
        ids = [r.id for r in session.scalars(select(ActionRow).where(ActionRow.state == S.APPROVED.value)
                                             .order_by(ActionRow.id)) if due(r, moment)][:limit]
    done: list[int] = []
    for action_id in ids:
        with session_scope(sessions) as session:
            if apply_action(session=session, action_id=action_id, now=now()):
                done.append(action_id)
    return done


def judge(applied: Mapping[str, int | None], replicas: Mapping[str, Replica | None], started_at: datetime | None,
          now: datetime, deadline: timedelta,
          was_fatal: frozenset[str] = frozenset()) -> tuple[ActionState, str] | None:
    """Pure: (final state, outcome) for a running action given the replicas as last reported, or None
    (``was_fatal``: the replicas a restart found FATAL, which it is there to bring back)."""
    pending = []
    for key, generation in applied.items():
        replica = replicas.get(key)
        where = progress(replica, generation, was_fatal=key in was_fatal)
        if where == "fatal":
            return S.FAILED, fatal_reason(key, replica)
        if where == "pending":
            pending.append(key)
    if not pending:
        return S.SUCCEEDED, "every replica converged" if applied else "nothing to do"
    if started_at is not None and now - started_at > deadline:
        return S.FAILED, f"deadline of {deadline.total_seconds():g}s passed; waiting on {', '.join(pending)}"
    return None


def judge_live_cap(cap: int | None, keys: list[str], replicas: Mapping[str, Replica | None],
                   started_at: datetime | None, now: datetime,
                   deadline: timedelta) -> tuple[ActionState, str] | None:
    """Pure: (final state, outcome) for a running ``set_live_cap`` given the replicas as last reported, or None."""
    pending = []
    for key in keys:
        replica = replicas.get(key)
        where, why = cap_progress(key, None if replica is None else replica.state,
                                  None if replica is None else reported(replica.live_limits), cap)
        if where == "fatal":
            return S.FAILED, why or f"{key} cannot take a live cap"
        if where == "pending":
            pending.append(key)
    if not pending:
        return S.SUCCEEDED, (f"{cap_words(cap)} written for {', '.join(keys)}: taken at the engine's next step, "
                             "no restart")
    if started_at is not None and now - started_at > deadline:
        return S.FAILED, f"deadline of {deadline.total_seconds():g}s passed; waiting on {', '.join(pending)}"
    return None


def reconcile(*, session: Session, now: datetime, deadline: timedelta,
              settings: RolloutSettings | None = None) -> dict[int, str]:
    """Finish running actions whose replicas converged or failed, advance rollouts; {action id: new state}."""
    settings = settings or RolloutSettings(deadline=deadline)
    finished: dict[int, str] = {}
    running = session.scalars(select(ActionRow).where(ActionRow.state == S.RUNNING.value).order_by(ActionRow.id))
    for row in running.all():
        try:
            payload = read_payload(row)
        except CorruptPayload as exc:
            _fail_corrupt(session, row, exc, now)
            finished[row.id] = S.FAILED.value
            continue
        if is_rollout(payload, row.replicas):
            assert isinstance(payload, RollingRestartPayload | SetFlagsPayload | MaxNumSeqsPayload
                              | AddEngineFlagPayload | SetLiveCapPayload)
            verdict = rollout.advance(session=session, row=row, payload=payload, now=now, settings=settings)
        elif isinstance(payload, SetLiveCapPayload):
            keys = list(row.replicas)
            verdict = judge_live_cap(payload.live_cap, keys, {k: session.get(Replica, split_key(k)) for k in keys},
                                     row.started_at, now, deadline)
        else:
            applied = (payload.applied if isinstance(payload, Applied) else None) or {}
            captured = payload.captured if isinstance(payload, RestartPayload | PlannedRestartPayload) else None
            was_fatal = frozenset(k for k, c in (captured or {}).items() if c.state == ReplicaState.FATAL)
            verdict = judge(applied, {k: session.get(Replica, split_key(k)) for k in applied}, row.started_at,
                            now, deadline, was_fatal)
            if isinstance(payload, RestartPayload | PlannedRestartPayload):
                # Dumps that arrived are attached every round; a finished restart says where none came.
                stackdumps.attach(session=session, row=row, payload=payload, final=verdict is not None)
        if verdict is not None and finish(session=session, row=row, dst=verdict[0], outcome=verdict[1], now=now):
            finished[row.id] = verdict[0].value
    return finished
