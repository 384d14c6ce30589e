"""The notifier's own alerts: a Watchdog that always fires, and NotificationsFailing when deliveries keep failing.

Both bypass the route tree and go only to the receiver the config names for them: the Watchdog to a dead man's
switch (a heartbeat service that pages when its pings stop, so a dead control plane, a dead notifier or a
broken network still reaches on-call), NotificationsFailing to a second path to on-call (when the first one
is what is failing, routing it there would tell nobody). Neither is ever raised without its receiver.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.notify.lifecycle import FIRING, NOTIFIER_POLICY, fingerprint, resolve
from controlplane.notify.routing import RouteMatch
from controlplane.notify.secrets import ResolvedNotifier
from controlplane.store.models import AlertRow, NotificationDelivery

POLICY = NOTIFIER_POLICY
WATCHDOG, FAILING = "Watchdog", "NotificationsFailing"


def _firing(session: Session, name: str) -> AlertRow | None:
    rows = session.scalars(select(AlertRow).where(AlertRow.policy == POLICY, AlertRow.state == FIRING)
                           .order_by(AlertRow.id.desc()))
    return next((a for a in rows if a.labels.get("alertname") == name), None)


def _fire(session: Session, name: str, severity: str, summary: str, now: datetime) -> AlertRow:
    labels = {"alertname": name, "severity": severity, "target": "fleet"}
    alert = AlertRow(fingerprint=fingerprint(labels), labels=labels, annotations={"summary": summary},
                     severity=severity, state=FIRING, starts_at=now, ends_at=None, action_id=None, updated_at=now,
                     policy=POLICY, last_seen_at=now, resolved_reason="")
    session.add(alert)
    session.flush()
    return alert


def sync(*, session: Session, notifier: ResolvedNotifier, now: datetime) -> None:
    """Keep the Watchdog firing, and fire or resolve NotificationsFailing from the outbox's state."""
    if notifier.watchdog_receiver is not None and _firing(session, WATCHDOG) is None:
        _fire(session, WATCHDOG, "info", "Pitstop's paging path is alive: this alert always fires; page when its "
              "notifications stop", now)
    if notifier.failing_receiver is None:
        return
    why = failing(session=session, notifier=notifier, now=now)
    current = _firing(session, FAILING)
    if why is not None and current is None:
        _fire(session, FAILING, "page", f"notifications are failing: {why}", now)
    elif why is None and current is not None:
        resolve(alert=current, now=now, reason="notifications are delivered again")
    elif why is not None and current is not None:
        current.annotations, current.last_seen_at = {"summary": f"notifications are failing: {why}"}, now


def failing(*, session: Session, notifier: ResolvedNotifier, now: datetime) -> str | None:
    """Why notifications count as failing now (ignoring the failing receiver's own), or None."""
    since = now - timedelta(seconds=notifier.failing_after)
    others = NotificationDelivery.receiver != notifier.failing_receiver
    gave_up = session.scalar(select(func.count(NotificationDelivery.id)).where(
        others, NotificationDelivery.status == "failed", NotificationDelivery.created_at >= since)) or 0
    late = session.scalar(select(func.count(NotificationDelivery.id)).where(
        others, NotificationDelivery.status == "pending", NotificationDelivery.created_at < since)) or 0
    if not gave_up and not late:
        return None
    parts = []
    if gave_up:
        parts.append(f"{gave_up} given up in the last {notifier.failing_after:g}s")
    if late:
        parts.append(f"{late} waiting longer than {notifier.failing_after:g}s")
    return "; ".join(parts)


def route_of(alert: AlertRow, notifier: ResolvedNotifier) -> list[RouteMatch] | None:
    """The notifier's own alerts' only route (None: an ordinary alert, routed by the tree)."""
    if alert.policy != POLICY:
        return None
    name = alert.labels.get("alertname")
    receiver = notifier.watchdog_receiver if name == WATCHDOG else notifier.failing_receiver
    if receiver is None:
        return []
    repeat = notifier.watchdog_interval if name == WATCHDOG else 4 * 3600.0
    return [RouteMatch(route_id=f"{{}}/{POLICY}/{name}", receiver=receiver, group_by=("alertname",),
                       group_wait=0.0, group_interval=60.0, repeat_interval=repeat)]
