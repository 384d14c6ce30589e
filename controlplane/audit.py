"""The audit log: who did what, when, from where, to what. Written in the same transaction as the write.

A write made for a person by a token that acts on behalf of people names the person as the actor (at the role
they acted with) and the token in ``detail["via"]``: who decided, and which credential carried it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.security.roles import Principal
from controlplane.store.models import AuditEntry


class AuditOut(BaseModel):
    id: int
    at: datetime
    actor: str
    role: str
    client: str | None
    what: str
    target: str
    detail: dict[str, Any]


def record(*, session: Session, who: Principal, what: str, now: datetime, target: str = "",
           client: str | None = None, detail: dict[str, Any] | None = None) -> None:
    """Add one audit entry; ``detail`` must never carry a secret (callers pass ids and names, not tokens)."""
    detail = dict(detail or {})
    if who.via is not None:
        detail["via"] = who.via
    session.add(AuditEntry(at=now, actor=who.name, role=who.role.value, client=client, what=what, target=target,
                           detail=detail))


def list_audit(*, session: Session, limit: int = 200, actor: str | None = None) -> list[AuditOut]:
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if actor is not None:
        query = query.where(AuditEntry.actor == actor)
    return [AuditOut(id=e.id, at=e.at, actor=e.actor, role=e.role, client=e.client, what=e.what, target=e.target,
                     detail=dict(e.detail)) for e in session.scalars(query)]
