"""The notifier's edge, run by the leader: alerts -> groups -> the outbox, then the outbox -> receivers.

``queue`` reads the firing alerts (and the resolved ones a receiver was told are firing), routes each down the
route tree, groups them per receiver by their ``group_by`` labels, asks ``grouping.due`` whether each group is
due, and for each that is writes one delivery (what to say, no secrets) and the group's memory in the same
transaction. ``send`` hands the due deliveries to ``outbox.send_due`` with each receiver's format and secret.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urljoin

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.notify import formats, grouping, routing
from controlplane.notify.config import ResolvedNotifier, ResolvedReceiver
from controlplane.notify.model import AlertView, Notification, Request, Severity, to_json
from controlplane.notify.outbox import PENDING, Receiver
from controlplane.notify.summary import ActionFacts, describe
from controlplane.policy.kinds import ActionKind
from controlplane.policy.lifecycle import ActionState
from controlplane.store.models import ActionRow, AlertRow, NotificationDelivery, NotificationGroup

log = logging.getLogger(__name__)

FIRING, RESOLVED = "firing", "resolved"
# The companion action of an alert (the restart a stall's notify alert goes with) is this recent at most.
ACTION_LOOKBACK = timedelta(hours=1)
_SEVERITIES: dict[str, Severity] = {"info": "info", "warning": "warning", "page": "page"}


@dataclass(frozen=True)
class Links:
    """Where notifications point: the console (``external_url``) and the published runbooks."""

    external_url: str
    runbook_base_url: str | None = None

    def action(self, action_id: int | None) -> str:
        return f"{self.external_url}/?action={action_id}" if action_id is not None else self.external_url

    def runbook(self, runbook: str | None) -> str | None:
        if not runbook:
            return None
        if "://" in runbook or self.runbook_base_url is None:
            return runbook
        return urljoin(self.runbook_base_url.rstrip("/") + "/", runbook)


def _labels(alert: AlertRow) -> dict[str, str]:
    return {str(k): str(v) for k, v in alert.labels.items() if v is not None}


def _facts(session: Session, alert: AlertRow) -> ActionFacts | None:
    """The latest action (not the alert itself) the alert's policy took on its target since it began."""
    row = session.scalars(
        select(ActionRow).where(ActionRow.policy == alert.policy, ActionRow.target == alert.labels.get("target"),
                                ActionRow.kind != ActionKind.ALERT.value,
                                ActionRow.created_at >= alert.starts_at - ACTION_LOOKBACK)
        .order_by(ActionRow.id.desc()).limit(1)).first()
    if row is None:
        return None
    first = (row.guardrails or [{}])[0] if row.guardrails else {}
    return ActionFacts(kind=row.kind, target=row.target, state=ActionState(row.state), created_at=row.created_at,
                       finished_at=row.finished_at, outcome=row.outcome, guardrail=first.get("guardrail"),
                       guardrail_reason=str(first.get("reason") or ""))


def _view(session: Session, alert: AlertRow, links: Links) -> AlertView:
    notes = alert.annotations or {}
    runbook = links.runbook(notes.get("runbook_url"))
    annotations = {"summary": str(notes.get("summary") or "")}
    if runbook:
        annotations["runbook_url"] = runbook
    if alert.resolved_reason:
        annotations["resolved_reason"] = alert.resolved_reason
    if alert.policy == "circuit-breaker":
        did = "automation is stopped until an operator resets the circuit breaker"
    else:
        did = describe(_facts(session, alert))
    findings = notes.get("evidence") or []
    evidence: dict[str, object] = {}
    if findings:
        last = findings[-1]
        evidence = {"detector": last.get("detector"), "measured": last.get("measured") or {},
                    "readings": (last.get("evidence") or [])[-5:]}
    return AlertView(fingerprint=alert.fingerprint, status="firing" if alert.state == FIRING else "resolved",
                     labels=_labels(alert), annotations=annotations, starts_at=alert.starts_at,
                     ends_at=alert.ends_at, generator_url=links.action(notes.get("action_id") or alert.action_id),
                     severity=_SEVERITIES.get(alert.severity, "warning"), action_summary=did, evidence=evidence)


def queue(*, session: Session, notifier: ResolvedNotifier, links: Links, now: datetime) -> list[int]:
    """Write a delivery for every group that is due; the deliveries' ids."""
    if notifier.route is None or not notifier.receivers:
        return []
    groups_rows = {(g.receiver, g.group_key): g for g in session.scalars(select(NotificationGroup))}
    told_ids = {int(i) for g in groups_rows.values() for i, s in (g.told or {}).items() if s == FIRING}
    alerts = list(session.scalars(select(AlertRow).where(AlertRow.state == FIRING)))
    if told_ids:
        alerts += list(session.scalars(select(AlertRow).where(AlertRow.state == RESOLVED,
                                                              AlertRow.id.in_(told_ids))))
    by_group: dict[tuple[str, str], tuple[routing.RouteMatch, dict[str, str], list[AlertRow]]] = {}
    for alert in alerts:
        labels = _labels(alert)
        for m in routing.match(notifier.route, labels):
            slot = (m.receiver, m.group_key(labels))
            by_group.setdefault(slot, (m, m.group_labels(labels), []))[2].append(alert)
    queued = []
    for (receiver_name, key), (m, labels, members) in by_group.items():
        receiver = notifier.receivers.get(receiver_name)
        if receiver is None:
            continue
        row = groups_rows.get((receiver_name, key))
        state = grouping.GroupState(last_sent_at=None if row is None else row.last_sent_at,
                                    told={int(i): s for i, s in (row.told or {}).items()} if row else {})
        timing = grouping.Timing(group_wait=timedelta(seconds=m.group_wait),
                                 group_interval=timedelta(seconds=m.group_interval),
                                 repeat_interval=timedelta(seconds=m.repeat_interval),
                                 send_resolved=receiver.send_resolved)
        view = [grouping.Member(a.id, "firing" if a.state == FIRING else "resolved", a.starts_at) for a in members]
        reason = grouping.due(state, view, timing, now)
        if reason is None:
            continue
        tell = grouping.members_to_tell(state, view)
        ids = {t.alert_id for t in tell}
        notification = Notification(receiver=receiver_name, group_key=key, group_labels=labels,
                                    alerts=[_view(session, a, links) for a in members if a.id in ids],
                                    external_url=links.external_url)
        delivery = NotificationDelivery(
            alert_id=None, receiver=receiver_name, attempt=1, status=PENDING, response_code=None, error="",
            created_at=now, next_retry_at=now, group_key=key, reason=reason, notification=to_json(notification),
            alert_ids=sorted(ids))
        session.add(delivery)
        told = {str(i): s for i, s in grouping.after_telling(tell).items()}
        if row is None:
            session.add(NotificationGroup(receiver=receiver_name, group_key=key, group_labels=labels,
                                          last_sent_at=now, told=told))
        else:
            row.last_sent_at, row.told, row.group_labels = now, told, labels
        session.flush()
        queued.append(delivery.id)
    return queued


def _renderer(receiver: ResolvedReceiver) -> Receiver:
    url = receiver.url.get_secret_value()
    secret = None if receiver.secret is None else receiver.secret.get_secret_value()

    def render(n: Notification, now: datetime) -> Request:
        settings: dict[str, Any] = {"url": url}
        if receiver.kind == "pagerduty":
            settings["routing_key"] = secret
        elif receiver.kind == "webhook":
            settings["secret"] = secret
        return formats.render(receiver.kind, n, now=now, **settings)

    return Receiver(name=receiver.name, render=render, max_attempts=receiver.max_attempts,
                    timeout_seconds=receiver.timeout_seconds)


def receivers(notifier: ResolvedNotifier) -> dict[str, Receiver]:
    """Each configured receiver, ready for ``outbox.send_due``."""
    return {name: _renderer(r) for name, r in notifier.receivers.items()}


def deliveries_of(session: Session, alert: AlertRow) -> Sequence[NotificationDelivery]:
    """The deliveries that carried an alert, oldest first (for ``GET /v1/alerts/{id}``)."""
    rows = session.scalars(select(NotificationDelivery).where(NotificationDelivery.created_at >= alert.starts_at)
                           .order_by(NotificationDelivery.id))
    return [d for d in rows if d.alert_id == alert.id or alert.id in (d.alert_ids or [])]
