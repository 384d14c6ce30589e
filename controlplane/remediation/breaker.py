"""The circuit breaker's stored state: tripped by the policy job, reset (and audited) by an operator.

The guardrails decide *whether* the breaker trips (``guardrails.breaker_check``, pure); this module keeps the
trip across control-plane restarts and feeds it back into the next ``GuardState``.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from sqlalchemy.orm import Session

from controlplane.policy.guardrails import GuardState
from controlplane.store.models import BreakerState

_ROW = 1


class BreakerOut(BaseModel):
    tripped: bool
    tripped_at: datetime | None
    reason: str
    reset_at: datetime | None
    reset_by: str | None


def _row(session: Session) -> BreakerState:
    row = session.get(BreakerState, _ROW)
    if row is None:
        row = BreakerState(id=_ROW, tripped_at=None, reason="", reset_at=None, reset_by=None)
        session.add(row)
        session.flush()
    return row


def read(*, session: Session) -> BreakerOut:
    row = session.get(BreakerState, _ROW)
    if row is None:
        return BreakerOut(tripped=False, tripped_at=None, reason="", reset_at=None, reset_by=None)
    return BreakerOut(tripped=row.tripped_at is not None, tripped_at=row.tripped_at, reason=row.reason,
                      reset_at=row.reset_at, reset_by=row.reset_by)


def with_breaker(state: GuardState, breaker: BreakerOut) -> GuardState:
    """The guard state with the stored trip (or the last reset) applied."""
    return state.model_copy(update={"breaker_tripped_at": breaker.tripped_at,
                                    "breaker_reason": breaker.reason or None,
                                    "breaker_reset_at": breaker.reset_at})


def trip(*, session: Session, reason: str, now: datetime) -> bool:
    """Trip the breaker; False when it was already tripped (the first reason is kept)."""
    row = _row(session)
    if row.tripped_at is not None:
        return False
    row.tripped_at, row.reason = now, reason
    return True


def reset(*, session: Session, by: str, now: datetime) -> BreakerOut:
    """Close the breaker: automation resumes, and only what happens from now on can trip it again."""
    row = _row(session)
    row.tripped_at, row.reason, row.reset_at, row.reset_by = None, "", now, by
    session.flush()
    return read(session=session)
