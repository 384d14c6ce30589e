"""Alerts as stored (raised by policies' ``alert`` actions and notify; delivered by the alerting job)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.store.models import AlertRow


class AlertOut(BaseModel):
    id: int
    fingerprint: str
    labels: dict[str, Any]
    annotations: dict[str, Any]
    severity: str
    state: str
    starts_at: datetime
    ends_at: datetime | None
    action_id: int | None


def list_alerts(*, session: Session, state: str | None = None, limit: int = 200) -> list[AlertOut]:
    query = select(AlertRow).order_by(AlertRow.id.desc()).limit(limit)
    if state is not None:
        query = query.where(AlertRow.state == state)
    return [AlertOut(id=a.id, fingerprint=a.fingerprint, labels=dict(a.labels), annotations=dict(a.annotations),
                     severity=a.severity, state=a.state, starts_at=a.starts_at, ends_at=a.ends_at,
                     action_id=a.action_id) for a in session.scalars(query)]
