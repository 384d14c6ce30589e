"""Alerts as stored (raised by policies' ``alert`` actions and ``notify``), with the notifications that
carried them; an operator may resolve one by hand."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.notify.notifier import deliveries_of
from controlplane.remediation.alerting import FIRING, resolve
from controlplane.store.models import AlertRow, NotificationDelivery


class DeliveryOut(BaseModel):
    id: int
    receiver: str
    reason: str
    status: str
    attempt: int
    response_code: int | None
    error: str
    created_at: datetime
    next_retry_at: datetime | None
    sent_at: datetime | None


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
    policy: str | None = None
    last_seen_at: datetime | None = None
    resolved_reason: str = ""


class AlertDetailOut(AlertOut):
    deliveries: list[DeliveryOut]


def _out(a: AlertRow) -> AlertOut:
    return AlertOut(id=a.id, fingerprint=a.fingerprint, labels=dict(a.labels), annotations=dict(a.annotations),
                    severity=a.severity, state=a.state, starts_at=a.starts_at, ends_at=a.ends_at,
                    action_id=a.action_id, policy=a.policy, last_seen_at=a.last_seen_at,
                    resolved_reason=a.resolved_reason or "")


def _delivery(d: NotificationDelivery) -> DeliveryOut:
    return DeliveryOut(id=d.id, receiver=d.receiver, reason=d.reason or "", status=d.status, attempt=d.attempt,
                       response_code=d.response_code, error=d.error, created_at=d.created_at,
                       next_retry_at=d.next_retry_at, sent_at=d.sent_at)


def list_alerts(*, session: Session, state: str | None = None, limit: int = 200) -> list[AlertOut]:
    query = select(AlertRow).order_by(AlertRow.id.desc()).limit(limit)
    if state is not None:
        query = query.where(AlertRow.state == state)
    return [_out(a) for a in session.scalars(query)]


def get_alert(*, session: Session, alert_id: int) -> AlertDetailOut | None:
    alert = session.get(AlertRow, alert_id)
    if alert is None:
        return None
    return AlertDetailOut(**_out(alert).model_dump(),
                          deliveries=[_delivery(d) for d in deliveries_of(session, alert)])


def resolve_by_hand(*, session: Session, alert_id: int, by: str, now: datetime) -> bool:
    """An operator resolves a firing alert (the notifier tells its receivers); False if it is not firing."""
    alert = session.get(AlertRow, alert_id, with_for_update=True)
    if alert is None or alert.state != FIRING:
        return False
    resolve(alert=alert, now=now, reason=f"resolved by {by}")
    return True
