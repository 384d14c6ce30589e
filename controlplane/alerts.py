"""Alerts as stored (raised by policies' ``alert`` actions and ``notify``), with the notifications that
carried them; an operator may resolve one by hand.

Each firing alert also says whether it is muted now, judged at read time as the notifier judges it:
``silenced_by`` (the silences' ids) and ``inhibited_by`` (the causing alerts' ids, or a reason such as "node
gpu-a is cordoned"). A muted alert is listed like any other; it is only not notified.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.notify.notifier import deliveries_of, mutes
from controlplane.notify.silencing import Muting
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
    # Muted now (firing alerts only): by these silences, and by these alerts (ids) or reasons.
    silenced_by: list[int] = []
    inhibited_by: list[int | str] = []


class AlertDetailOut(AlertOut):
    deliveries: list[DeliveryOut]


def _out(a: AlertRow, muting: Muting | None = None) -> AlertOut:
    muting = muting or Muting()
    return AlertOut(id=a.id, fingerprint=a.fingerprint, labels=dict(a.labels), annotations=dict(a.annotations),
                    severity=a.severity, state=a.state, starts_at=a.starts_at, ends_at=a.ends_at,
                    action_id=a.action_id, policy=a.policy, last_seen_at=a.last_seen_at,
                    resolved_reason=a.resolved_reason or "", silenced_by=list(muting.silenced_by),
                    inhibited_by=list(muting.inhibited_by))


def _delivery(d: NotificationDelivery) -> DeliveryOut:
    return DeliveryOut(id=d.id, receiver=d.receiver, reason=d.reason or "", status=d.status, attempt=d.attempt,
                       response_code=d.response_code, error=d.error, created_at=d.created_at,
                       next_retry_at=d.next_retry_at, sent_at=d.sent_at)


def list_alerts(*, session: Session, now: datetime, stale_after: timedelta | None = None, state: str | None = None,
                silenced: bool | None = None, inhibited: bool | None = None, limit: int = 200) -> list[AlertOut]:
    """Newest first; ``silenced``/``inhibited``: only the alerts that are (True) or are not (False) so now."""
    muted = mutes(session, now=now, stale_after=stale_after)
    query = select(AlertRow).order_by(AlertRow.id.desc())
    if state is not None:
        query = query.where(AlertRow.state == state)
    for wanted, ids in ((silenced, [i for i, m in muted.items() if m.silenced_by]),
                        (inhibited, [i for i, m in muted.items() if m.inhibited_by])):
        if wanted is True:
            query = query.where(AlertRow.id.in_(ids))
        elif wanted is False and ids:
            query = query.where(AlertRow.id.not_in(ids))
    return [_out(a, muted.get(a.id)) for a in session.scalars(query.limit(limit))]


def get_alert(*, session: Session, alert_id: int, now: datetime,
              stale_after: timedelta | None = None) -> AlertDetailOut | None:
    alert = session.get(AlertRow, alert_id)
    if alert is None:
        return None
    muting = mutes(session, now=now, stale_after=stale_after).get(alert.id)
    return AlertDetailOut(**_out(alert, muting).model_dump(),
                          deliveries=[_delivery(d) for d in deliveries_of(session, alert)])


def resolve_by_hand(*, session: Session, alert_id: int, by: str, now: datetime) -> bool:
    """An operator resolves a firing alert (the notifier tells its receivers); False if it is not firing."""
    alert = session.get(AlertRow, alert_id, with_for_update=True)
    if alert is None or alert.state != FIRING:
        return False
    resolve(alert=alert, now=now, reason=f"resolved by {by}")
    return True
