"""Action records in the store: create, read (validated), move between states (guarded, with a trail), and the
guard state the guardrails read.

The states, the allowed transitions and who owns each arrow are ``policy.lifecycle``'s; the payload of each
kind is ``policy.payloads``'; what each kind is, ``policy.kinds``. Every state change goes through
``transition``: the table's guard first, then a write conditional on the old state (the claim two leaders
race on), then a line in ``action_transitions``. Every final state written here (at creation or by a transition)
is noted for ``finished.watch``, which counts it once the session commits.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args

from pydantic import BaseModel, Field
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from controlplane.policy import payloads as p
from controlplane.policy.guardrails import STATE_OF, ActionRecord, Decision, GuardState
from controlplane.policy.kinds import ActionKind, find
from controlplane.policy.lifecycle import FINAL, ActionState, check_transition
from controlplane.policy.payloads import CorruptPayload, Payload, parse_payload, payload_json
from controlplane.policy.proposals import ProposedAction
from controlplane.remediation import finished
from controlplane.store.models import ActionRow, ActionTransitionRow, AlertRow

S = ActionState
# Who wrote the states the executor owns, in the trail.
EXECUTOR = "executor"


class TransitionOut(BaseModel):
    at: datetime
    from_state: ActionState | None
    to_state: ActionState
    by: str
    cause: str


P = TypeVar("P", bound=BaseModel)


class _Common(BaseModel):
    id: int
    target: str
    target_kind: str
    node: str | None
    replica: str | None
    model: str | None
    state: ActionState
    reason: str
    policy: str | None
    evidence: list[Any]
    guardrails: list[Any]
    replicas: list[str]
    requested_by: str
    approved_by: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    transitions: list[TransitionOut] = Field(default_factory=list)


class ActionOutBase(_Common, Generic[P]):
    params: P


class RestartActionOut(ActionOutBase[p.RestartPayload]):
    kind: Literal["restart"]


class PlannedRestartActionOut(ActionOutBase[p.PlannedRestartPayload]):
    kind: Literal["planned_restart"]


class DrainActionOut(ActionOutBase[p.DrainPayload]):
    kind: Literal["drain"]


class RollingRestartActionOut(ActionOutBase[p.RollingRestartPayload]):
    kind: Literal["rolling_restart"]


class SetFlagsActionOut(ActionOutBase[p.SetFlagsPayload]):
    kind: Literal["set_flags"]


class MaxNumSeqsActionOut(ActionOutBase[p.MaxNumSeqsPayload]):
    kind: Literal["lower_max_num_seqs", "raise_max_num_seqs"]


class AddEngineFlagActionOut(ActionOutBase[p.AddEngineFlagPayload]):
    kind: Literal["add_engine_flag"]


class SetLiveCapActionOut(ActionOutBase[p.SetLiveCapPayload]):
    kind: Literal["set_live_cap"]


class CordonActionOut(ActionOutBase[p.CordonPayload]):
    kind: Literal["cordon", "uncordon"]


class AlertActionOut(ActionOutBase[p.AlertPayload]):
    kind: Literal["alert"]


class UnreadableActionOut(_Common):
    """A stored action whose payload no longer validates: shown as stored, with ``problem`` saying why."""

    kind: str
    params: dict[str, Any]
    problem: str


# What the API serves for an action: typed per kind, so the schema documents each kind's payload.
_TYPED = (RestartActionOut, PlannedRestartActionOut, DrainActionOut, RollingRestartActionOut, SetFlagsActionOut,
          MaxNumSeqsActionOut, AddEngineFlagActionOut, SetLiveCapActionOut, CordonActionOut, AlertActionOut)
ActionOut = Annotated[
    RestartActionOut | PlannedRestartActionOut | DrainActionOut | RollingRestartActionOut | SetFlagsActionOut
    | MaxNumSeqsActionOut | AddEngineFlagActionOut | SetLiveCapActionOut | CordonActionOut | AlertActionOut,
    Field(discriminator="kind"),
] | UnreadableActionOut


# Any one of them, as the functions here return it.
AnyActionOut = ActionOutBase[Any] | UnreadableActionOut


def read_payload(row: ActionRow) -> Payload:
    """The row's payload, validated as its kind; raises ``CorruptPayload`` for a row that no longer fits."""
    if not isinstance(row.params, dict):
        raise CorruptPayload(f"stored {row.kind!r} payload is not an object")
    return parse_payload(row.kind, row.params)


def write_payload(row: ActionRow, payload: Payload, now: datetime | None = None) -> None:
    """Store ``payload`` as the row's JSON (the executor's progress: applied, captured, the rollout)."""
    row.params = payload_json(payload)
    if now is not None:
        row.updated_at = now


def _fields(row: ActionRow, trail: list[TransitionOut]) -> dict[str, Any]:
    return dict(
        id=row.id, kind=row.kind, target=row.target, target_kind=row.target_kind, node=row.node,
        replica=row.replica, model=row.model, state=row.state, reason=row.reason,
        policy=row.policy, evidence=list(row.evidence), guardrails=list(row.guardrails),
        replicas=list(row.replicas), requested_by=row.requested_by, approved_by=row.approved_by,
        created_at=row.created_at, updated_at=row.updated_at, started_at=row.started_at,
        finished_at=row.finished_at, outcome=row.outcome, transitions=trail,
    )


# Each kind's output class, read off the classes' own ``kind`` literals.
_OUT: dict[str, type[ActionOutBase[Any]]] = {
    kind: cls for cls in _TYPED for kind in get_args(cls.model_fields["kind"].annotation)
}


def action_out(row: ActionRow, trail: list[TransitionOut] | None = None) -> AnyActionOut:
    fields = _fields(row, trail or [])
    try:
        payload = read_payload(row)
    except CorruptPayload as exc:
        return UnreadableActionOut(**fields, params=dict(row.params) if isinstance(row.params, dict) else {},
                             problem=str(exc))
    return _OUT[payload.kind](**fields, params=payload)


def _trails(session: Session, ids: list[int]) -> dict[int, list[TransitionOut]]:
    out: dict[int, list[TransitionOut]] = defaultdict(list)
    if not ids:
        return out
    for t in session.scalars(select(ActionTransitionRow).where(ActionTransitionRow.action_id.in_(ids))
                             .order_by(ActionTransitionRow.id)):
        out[t.action_id].append(TransitionOut(at=t.at, from_state=None if t.from_state is None
                                              else ActionState(t.from_state), to_state=ActionState(t.to_state),
                                              by=t.by, cause=t.cause))
    return out


def state_for(decision: Decision) -> ActionState:
    return STATE_OF[decision.verdict]


def _trail(session: Session, action_id: int, src: ActionState | None, dst: ActionState, now: datetime, by: str,
           cause: str) -> None:
    session.add(ActionTransitionRow(action_id=action_id, at=now, from_state=None if src is None else src.value,
                                    to_state=dst.value, by=by, cause=cause[:2000]))


def create(*, session: Session, proposal: ProposedAction, state: ActionState | str, now: datetime,
           requested_by: str, policy: str | None, guardrails: list[dict[str, Any]], approved_by: str | None = None,
           target_kind: str | None = None, target: str | None = None, outcome: str = "") -> ActionRow:
    """Store a new action in ``state`` (one the table allows at creation), with the first line of its trail."""
    state = ActionState(state)
    check_transition(None, state)
    payload = proposal.payload
    if proposal.runbook_url and payload.runbook_url is None:
        payload = payload.model_copy(update={"runbook_url": proposal.runbook_url})
    final = state not in (S.PROPOSED, S.APPROVED)
    row = ActionRow(
        kind=payload.kind, target_kind=target_kind or proposal.target.kind, target=target or proposal.target.key,
        node=proposal.target.node, replica=proposal.target.replica, model=proposal.model or proposal.target.model,
        params=payload_json(payload), state=state.value, reason=proposal.reason, policy=policy,
        evidence=[f.model_dump(mode="json") for f in proposal.findings], guardrails=guardrails,
        replicas=list(proposal.replicas), disruptive=proposal.disruptive, expected_generation=None,
        requested_by=requested_by, approved_by=approved_by if state is S.APPROVED else None,
        created_at=now, updated_at=now, started_at=now if state is S.SUCCEEDED else None,
        finished_at=now if final else None, outcome=outcome,
    )
    session.add(row)
    session.flush()
    cause = "; ".join(str(g.get("reason") or g.get("verdict")) for g in guardrails if g) or proposal.reason
    _trail(session, row.id, None, state, now, requested_by, cause)
    finished.note(session, row.kind, state)
    return row


def record_decision(*, session: Session, decision: Decision, now: datetime, requested_by: str,
                    state: ActionState | str | None = None, approved_by: str | None = None,
                    policy: str | None = None) -> ActionRow:
    """Store one guardrail decision as an action row."""
    return create(session=session, proposal=decision.action, state=state or state_for(decision), now=now,
                  requested_by=requested_by, policy=policy, approved_by=approved_by,
                  guardrails=[{"verdict": decision.verdict.value, "guardrail": decision.guardrail,
                               "reason": decision.reason}])


GUARD_LOCK_ID = 0x7069_7467  # "pitg"; the leader lock is 0x70697474, the migration lock 0x70697473


def hold_guardrails(session: Session) -> None:
    """Take the fleet's guardrails for the rest of this transaction (docs/design.md, "Spreading rounds").

    Control planes holding different shards decide at the same moments; each reads the open actions and the
    guard state (rate window, budgets, breaker) and records its decisions under this lock, so the next one to
    decide counts them, and the rate limit and the breaker hold fleet-wide. On PostgreSQL a transaction-level
    advisory lock, released at commit or rollback (a control plane that dies mid-round releases it with its
    connection). SQLite allows one writer and its leader holds every shard: nothing to take."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": GUARD_LOCK_ID})


def guard_state(*, session: Session, now: datetime, window: timedelta = timedelta(hours=1)) -> GuardState:
    """Recent actions as the guardrails' input (cooldowns, rate limits, budgets, breaker)."""
    rows = session.execute(select(ActionRow.policy, ActionRow.kind, ActionRow.target, ActionRow.created_at,
                                  ActionRow.state, ActionRow.replicas, ActionRow.model, ActionRow.disruptive,
                                  ActionRow.finished_at)
                           .where(ActionRow.created_at >= now - window)
                           .order_by(ActionRow.created_at, ActionRow.id))
    # An alert's cooldown keeps a firing alert from paging twice; once that alert resolved, the next breach is
    # a new alert and must page, so alert actions from before its resolution no longer count.
    cleared: dict[tuple[str | None, str], datetime] = {}
    for policy, labels, ends_at in session.execute(select(AlertRow.policy, AlertRow.labels, AlertRow.ends_at).where(
            AlertRow.state == "resolved", AlertRow.ends_at >= now - window)):
        key = (policy, str(labels.get("target", "")))
        cleared[key] = max(cleared.get(key, ends_at), ends_at)
    records = [ActionRecord(policy=policy or "operator", kind=kind, target=target, at=at,
                            status=ActionState(state), replicas=list(replicas), model=model,
                            # A kind the table no longer knows counts as it was stored.
                            disruptive=known.disrupts if (known := find(kind)) is not None else stored,
                            finished_at=finished)
               for policy, kind, target, at, state, replicas, model, stored, finished in rows
               if not (kind == ActionKind.ALERT and at <= cleared.get((policy, target), at - timedelta(1)))]
    return GuardState(records=records)


def list_actions(*, session: Session, state: str | None = None, target: str | None = None,
                 policy: str | None = None, limit: int = 200) -> list[AnyActionOut]:
    query = select(ActionRow).order_by(ActionRow.id.desc()).limit(limit)
    if state is not None:
        query = query.where(ActionRow.state == state)
    if target is not None:
        query = query.where(ActionRow.target == target)
    if policy is not None:
        query = query.where(ActionRow.policy == policy)
    rows = list(session.scalars(query))
    trails = _trails(session, [r.id for r in rows])
    return [action_out(r, trails.get(r.id)) for r in rows]


def get_action(*, session: Session, action_id: int) -> AnyActionOut | None:
    row = session.get(ActionRow, action_id)
    return None if row is None else action_out(row, _trails(session, [action_id]).get(action_id))


def transition(*, session: Session, action_id: int, src: ActionState, dst: ActionState, now: datetime,
               by: str = EXECUTOR, cause: str = "", **values: Any) -> bool:
    """Move one action from ``src`` to ``dst`` only if it is still in ``src`` (the claim two leaders race on),
    after the lifecycle's guard, and record the move in its trail. False: it was no longer in ``src``."""
    check_transition(src, dst)
    done = session.execute(update(ActionRow).where(ActionRow.id == action_id, ActionRow.state == src.value)
                           .values(state=dst.value, updated_at=now, **values))
    moved = int(getattr(done, "rowcount", 0) or 0) == 1
    if moved:
        _trail(session, action_id, src, dst, now, by, cause or str(values.get("outcome") or ""))
        if dst in FINAL:  # counted by ``pitstop_cp_actions_total`` once the session commits
            finished.note(session, session.scalars(select(ActionRow.kind).where(ActionRow.id == action_id)).one(),
                          dst)
    return moved


def finish(*, session: Session, row: ActionRow, dst: ActionState, outcome: str, now: datetime) -> bool:
    """End a running action with ``outcome`` (succeeded, failed or rolled back)."""
    moved = transition(session=session, action_id=row.id, src=S.RUNNING, dst=dst, now=now, finished_at=now,
                       outcome=outcome)
    return moved


def expire_proposals(*, session: Session, now: datetime, ttl: timedelta) -> list[int]:
    """Expire proposals older than ``ttl`` that nobody decided; the ids expired."""
    stale = session.scalars(select(ActionRow.id).where(ActionRow.state == S.PROPOSED.value,
                                                       ActionRow.created_at < now - ttl)).all()
    cause = f"no operator decided within {ttl.total_seconds():g}s: the evidence is stale"
    return [i for i in stale if transition(session=session, action_id=i, src=S.PROPOSED, dst=S.EXPIRED, now=now,
                                           cause=cause, finished_at=now, outcome=f"expired: {cause}")]


def approve(*, session: Session, action_id: int, by: str, now: datetime) -> bool:
    return transition(session=session, action_id=action_id, src=S.PROPOSED, dst=S.APPROVED, now=now, by=by,
                      cause=f"approved by {by}", approved_by=by)


def reject(*, session: Session, action_id: int, by: str, now: datetime, reason: str = "") -> bool:
    return transition(session=session, action_id=action_id, src=S.PROPOSED, dst=S.REJECTED, now=now, by=by,
                      approved_by=by, finished_at=now, outcome=f"rejected by {by}" + (f": {reason}" if reason else ""))
