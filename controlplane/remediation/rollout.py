"""The rollout's edge: read what ``policy.rollout.step`` needs from the store, call it, write what it returns.

The decisions (batches, the budget wait, convergence, the canary's judgement, the rollback) are the pure
step's; here are only the reads (the model's replicas with their desired generations, the canary's samples)
and the writes (desired state, the plan into the action's payload), once per round, in the caller's
transaction.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.fleet.desired import DesiredChange, set_desired
from controlplane.policy.live_cap import reported
from controlplane.policy.rollout import (
    DesiredWrite,
    Observed,
    ReplicaView,
    RolloutPayload,
    RolloutSettings,
    Step,
    Verdict,
    samples_since,
    start,
    step,
)
from controlplane.policy.signals import ReplicaSample, from_stored
from controlplane.policy.snapshot import split_key
from controlplane.remediation.records import write_payload
from controlplane.store.models import ActionRow, DesiredReplica, Replica
from controlplane.store.samples import series_of

__all__ = ["RolloutSettings", "advance", "begin"]


def _observe(session: Session, row: ActionRow, since: datetime | None) -> Observed:
    """The model's replicas (or the action's, without a model) as reported, and their samples since ``since``."""
    query = select(Replica, DesiredReplica.generation).outerjoin(
        DesiredReplica, (DesiredReplica.node == Replica.node) & (DesiredReplica.name == Replica.name))
    if row.model is not None:
        query = query.where(Replica.model == row.model)
    views = {}
    for replica, desired in session.execute(query):
        key = f"{replica.node}/{replica.name}"
        if row.model is None and key not in row.replicas:
            continue
        views[key] = ReplicaView(
            key=key, state=replica.state, ready=replica.ready, generation=replica.generation,
            engine_args=tuple(str(a) for a in replica.engine_args), gpus=tuple(int(g) for g in replica.gpus),
            managed=replica.managed, last_exit_code=replica.last_exit_code, desired_generation=desired,
            live_limits=reported(replica.live_limits))
    samples: dict[str, list[ReplicaSample]] = defaultdict(list)
    if since is not None and views:
        nodes = {split_key(k)[0] for k in views}
        series = series_of(session, kind="replica", since=since, nodes=sorted(nodes), raw_only=True)
        for (node, subject), points in series.items():
            key = f"{node}/{subject}"
            if key in views:  # the canary is judged on its windows
                samples[key] = [from_stored(at, values, full=True) for at, values in points]
    return Observed(replicas=views, samples=samples)


def _write(session: Session, row: ActionRow, payload: RolloutPayload, done: Step, now: datetime) -> None:
    """Write the step's desired changes, record the generations they got, and keep the plan in the action."""
    plan = done.plan
    applied = dict(plan.batch)
    for write in done.writes:
        got = _write_desired(session, write, now)
        if write.key in applied:
            applied[write.key] = got
    if applied != plan.batch:  # another writer moved the generation on: wait for the one really asked
        plan = plan.model_copy(update={"batch": applied})
    write_payload(row, payload.model_copy(update={"rollout": plan}), now)


def _write_desired(session: Session, write: DesiredWrite, now: datetime) -> int:
    node, name = split_key(write.key)
    if write.live:
        change = DesiredChange(live_cap=write.live_cap)  # given, even None: it replaces the cap
    elif write.engine_args is None:
        change = DesiredChange(restart=True, enabled=True)
    elif write.lift_cap:
        change = DesiredChange(engine_args=write.engine_args, enabled=True, live_cap=None)
    else:
        change = DesiredChange(engine_args=write.engine_args, enabled=True)
    return set_desired(session=session, node=node, name=name, change=change, now=now).generation


def begin(*, session: Session, row: ActionRow, payload: RolloutPayload, now: datetime) -> None:
    """Plan the rollout in the row and start its first batch (the canary, for a canary)."""
    _write(session, row, payload, start(payload, list(row.replicas), _observe(session, row, None), now), now)


def advance(*, session: Session, row: ActionRow, payload: RolloutPayload, now: datetime,
            settings: RolloutSettings) -> Verdict | None:
    """One step of a running rollout; (final state, outcome) when it is over."""
    plan = payload.rollout
    if plan is None:  # claimed but never planned (a crash between the two): plan it now
        begin(session=session, row=row, payload=payload, now=now)
        return None
    done = step(payload, plan, row.model, _observe(session, row, samples_since(plan, settings)), now, settings)
    _write(session, row, payload, done, now)
    return done.verdict
