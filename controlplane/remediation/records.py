"""Action records in the store: create, list, get, approve, reject, and the guard state the guardrails read.

State machine (who owns each arrow):
  proposed -> approved (operator approves, or guardrails allow) -> running (executor claims) ->
  succeeded | failed (executor reconciles against reports) ; rolled_back (a later rollback, by the executor)
  proposed -> rejected (operator) ; suppressed and shadow are final, written by the guardrails.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from controlplane.policy.guardrails import ActionRecord, Decision, GuardState, Verdict
from controlplane.policy.proposals import DISRUPTIVE, ProposedAction
from controlplane.store.models import ActionRow

STATES = ("proposed", "approved", "running", "succeeded", "failed", "rolled_back", "suppressed", "shadow",
          "rejected")
FINAL = frozenset({"succeeded", "failed", "rolled_back", "suppressed", "shadow", "rejected"})
# Operator kinds, as the guardrails see them: each stops the replica (drain and new flags restart or stop it).
GUARD_KIND = {"drain": "restart", "set_flags": "restart", "uncordon": "alert"}
# How a stored state counts for the guardrails: approved-but-not-started takes capacity already.
_RECORD_STATUS = {"approved": "running", "rolled_back": "failed"}


class ActionOut(BaseModel):
    id: int
    kind: str
    target: str
    target_kind: str
    node: str | None
    replica: str | None
    model: str | None
    params: dict[str, Any]
    state: str
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


def action_out(row: ActionRow) -> ActionOut:
    return ActionOut(
        id=row.id, kind=row.kind, target=row.target, target_kind=row.target_kind, node=row.node,
        replica=row.replica, model=row.model, params=dict(row.params), state=row.state, reason=row.reason,
        policy=row.policy, evidence=list(row.evidence), guardrails=list(row.guardrails),
        replicas=list(row.replicas), requested_by=row.requested_by, approved_by=row.approved_by,
        created_at=row.created_at, updated_at=row.updated_at, started_at=row.started_at,
        finished_at=row.finished_at, outcome=row.outcome,
    )


def state_for(decision: Decision) -> str:
    return {Verdict.ALLOWED: "approved", Verdict.SUPPRESSED: "suppressed", Verdict.SHADOW: "shadow",
            Verdict.AWAITING_APPROVAL: "proposed"}[decision.verdict]


def record_decision(*, session: Session, decision: Decision, now: datetime, requested_by: str,
                    kind: str | None = None, state: str | None = None, approved_by: str | None = None,
                    policy: str | None = None) -> ActionRow:
    """Store one guardrail decision as an action row (``kind`` overrides the guard kind for operator kinds)."""
    a: ProposedAction = decision.action
    state = state or state_for(decision)
    row = ActionRow(
        kind=kind or a.kind, target_kind=a.target.kind, target=a.target.key, node=a.target.node,
        replica=a.target.replica, model=a.model or a.target.model, params=dict(a.params), state=state,
        reason=a.reason, policy=policy, evidence=[f.model_dump(mode="json") for f in a.findings],
        guardrails=[{"verdict": decision.verdict.value, "guardrail": decision.guardrail, "reason": decision.reason}],
        replicas=list(a.replicas), disruptive=a.disruptive, expected_generation=None,
        requested_by=requested_by, approved_by=approved_by if state == "approved" else None,
        created_at=now, updated_at=now, started_at=None, finished_at=None, outcome="",
    )
    session.add(row)
    session.flush()
    return row


def guard_state(*, session: Session, now: datetime, window: timedelta = timedelta(hours=1)) -> GuardState:
    """Recent actions as the guardrails' input (cooldowns, rate limits, budgets, breaker)."""
    rows = session.scalars(select(ActionRow).where(ActionRow.created_at >= now - window)
                           .order_by(ActionRow.created_at, ActionRow.id))
    records = [ActionRecord(
        policy=r.policy or "operator", kind=GUARD_KIND.get(r.kind, r.kind), target=r.target, at=r.created_at,
        status=_RECORD_STATUS.get(r.state, r.state),
        replicas=list(r.replicas), model=r.model, disruptive=GUARD_KIND.get(r.kind, r.kind) in DISRUPTIVE,
    ) for r in rows]
    return GuardState(records=records)


def list_actions(*, session: Session, state: str | None = None, target: str | None = None,
                 policy: str | None = None, limit: int = 200) -> list[ActionOut]:
    query = select(ActionRow).order_by(ActionRow.id.desc()).limit(limit)
    if state is not None:
        query = query.where(ActionRow.state == state)
    if target is not None:
        query = query.where(ActionRow.target == target)
    if policy is not None:
        query = query.where(ActionRow.policy == policy)
    return [action_out(r) for r in session.scalars(query)]


def get_action(*, session: Session, action_id: int) -> ActionOut | None:
    row = session.get(ActionRow, action_id)
    return None if row is None else action_out(row)


def transition(*, session: Session, action_id: int, src: str, dst: str, now: datetime,
               **values: Any) -> bool:
    """Move one action from ``src`` to ``dst`` only if it is still in ``src``: the claim two leaders race on."""
    done = session.execute(update(ActionRow).where(ActionRow.id == action_id, ActionRow.state == src)
                           .values(state=dst, updated_at=now, **values))
    return int(getattr(done, "rowcount", 0) or 0) == 1


def approve(*, session: Session, action_id: int, by: str, now: datetime) -> bool:
    return transition(session=session, action_id=action_id, src="proposed", dst="approved", now=now,
                      approved_by=by)


def reject(*, session: Session, action_id: int, by: str, now: datetime, reason: str = "") -> bool:
    return transition(session=session, action_id=action_id, src="proposed", dst="rejected", now=now,
                      approved_by=by, finished_at=now, outcome=f"rejected by {by}" + (f": {reason}" if reason else ""))
