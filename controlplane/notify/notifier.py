"""The notifier's edge, run by the leader: alerts -> groups -> the outbox, then the outbox -> receivers.

``queue`` reads the firing alerts (and the resolved ones a receiver was told are firing), routes each down the
route tree, groups them per receiver by their ``group_by`` labels, asks ``grouping.due`` whether each group is
due, and for each that is writes one delivery (what to say, no secrets) and the group's memory in the same
transaction. ``send`` hands the due deliveries to ``outbox.send_due`` with each receiver's format and secret.

Silenced and inhibited alerts (``silencing``) are left out of their groups while they are muted: nothing is
sent for them, and a silence that begins after an alert paged sends no resolve for it either. The group keeps
remembering such an alert as told, so a muted alert that then resolves is still resolved at its receivers
(closing the page they got), and one still firing when its silence ends is not paged a second time.
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

from controlplane.config import ServerConfig
from controlplane.fleet.queries import node_status
from controlplane.fleet.schemas import NodeStatus
from controlplane.notify import formats, grouping, meta, routing, silencing
from controlplane.notify.lifecycle import NOTIFIER_POLICY
from controlplane.notify.model import AlertView, Notification, Request, Severity, to_json
from controlplane.notify.outbox import PENDING, Receiver
from controlplane.notify.secrets import ResolvedNotifier, ResolvedReceiver
from controlplane.notify.summary import ActionFacts, describe
from controlplane.policy.kinds import ActionKind
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.snapshot import ALERTMANAGER_POLICY
from controlplane.store.models import ActionRow, AlertRow, Node, NotificationDelivery, NotificationGroup, SilenceRow

log = logging.getLogger(__name__)

FIRING, RESOLVED = "firing", "resolved"
# The companion action of an alert (the restart a stall's notify alert goes with) is this recent at most.
ACTION_LOOKBACK = timedelta(hours=1)
_SEVERITIES: dict[str, Severity] = {"info": "info", "warning": "warning", "page": "page"}
# When a node counts as unreachable, for callers that do not say (the server's own default).
DEFAULT_STALE_AFTER = timedelta(seconds=ServerConfig.model_fields["stale_after_seconds"].default)


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
    """The latest action (not the alert itself) the alert's policy took on its target since it began; one held
    back only when none was taken (a cooldown's repeat of the restart taken is not news: the restart is)."""
    rows = list(session.scalars(
        select(ActionRow).where(ActionRow.policy == alert.policy, ActionRow.target == alert.labels.get("target"),
                                ActionRow.kind != ActionKind.ALERT.value,
                                ActionRow.created_at >= alert.starts_at - ACTION_LOOKBACK)
        .order_by(ActionRow.id.desc()).limit(20)))
    row = next((r for r in rows if r.state != ActionState.SUPPRESSED), rows[0] if rows else None)
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
    elif alert.policy == NOTIFIER_POLICY:
        did = ""  # the notifier's own alert: nothing was done to the fleet
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


def mutes(session: Session, *, now: datetime, stale_after: timedelta | None = None,
          firing: Sequence[AlertRow] | None = None) -> dict[int, silencing.Muting]:
    """Which firing alerts are silenced or inhibited now, and by what; ``firing``: every firing alert, when
    the caller has them already (any of them may inhibit another)."""
    if firing is None:
        firing = list(session.scalars(select(AlertRow).where(AlertRow.state == FIRING)))
    firing = [a for a in firing if a.state == FIRING]
    if not firing:
        return {}
    silences = []
    for row in session.scalars(select(SilenceRow).where(SilenceRow.starts_at <= now, SilenceRow.ends_at > now)):
        try:
            matchers = silencing.parse_matchers([str(m) for m in row.matchers])
        except ValueError as exc:  # validated when created: only a hand-edited row gets here
            log.warning("silence %s is ignored: %s", row.id, exc)
            continue
        silences.append(silencing.Silence(id=row.id, matchers=matchers, starts_at=row.starts_at,
                                          ends_at=row.ends_at))
    after = DEFAULT_STALE_AFTER if stale_after is None else stale_after
    nodes = {name: silencing.NodeFacts(
        name=name, cordoned=bool(cordoned), last_report_at=at,
        unreachable=node_status(last_report_at=at, now=now, stale_after=after) is NodeStatus.STALE)
        for name, cordoned, at in session.execute(select(Node.name, Node.cordoned, Node.last_report_at))}
    return silencing.mutes([silencing.AlertFacts(id=a.id, labels=_labels(a)) for a in firing], silences, nodes,
                           now)


def queue(*, session: Session, notifier: ResolvedNotifier, links: Links, now: datetime,
          stale_after: timedelta | None = None) -> list[int]:
    """Write a delivery for every group that is due, leaving muted alerts out; the deliveries' ids."""
    if notifier.route is None or not notifier.receivers:
        return []
    meta.sync(session=session, notifier=notifier, now=now)  # the Watchdog, NotificationsFailing
    groups_rows = {(g.receiver, g.group_key): g for g in session.scalars(select(NotificationGroup))}
    told_ids = {int(i) for g in groups_rows.values() for i, s in (g.told or {}).items() if s == FIRING}
    alerts = list(session.scalars(select(AlertRow).where(AlertRow.state == FIRING)))
    if told_ids:
        alerts += list(session.scalars(select(AlertRow).where(AlertRow.state == RESOLVED,
                                                              AlertRow.id.in_(told_ids))))
    muted = mutes(session, now=now, stale_after=stale_after, firing=alerts)
    by_group: dict[tuple[str, str], tuple[routing.RouteMatch, dict[str, str], list[AlertRow]]] = {}
    for alert in alerts:
        if alert.policy == ALERTMANAGER_POLICY:
            continue  # Alertmanager's own alert, posted to us: Alertmanager pages for it
        if alert.id in muted:
            continue  # silenced or inhibited: out of its groups while so
        labels = _labels(alert)
        own = meta.route_of(alert, notifier)
        for m in own if own is not None else routing.match(notifier.route, labels):
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
        view = [grouping.Member(a.id, "firing" if a.state == FIRING else "resolved", a.starts_at, a.fingerprint)
                for a in members]
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
        # A muted alert the receiver was told fires stays told: its resolve will close that page.
        told.update({str(i): s for i, s in (state.told or {}).items() if s == FIRING and i in muted})
        if row is None:
            session.add(NotificationGroup(receiver=receiver_name, group_key=key, group_labels=labels,
                                          last_sent_at=now, told=told))
        else:
            row.last_sent_at, row.told, row.group_labels = now, told, labels
        session.flush()
        queued.append(delivery.id)
    return queued


def _renderer(receiver: ResolvedReceiver, cap: float) -> Receiver:
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
                    timeout_seconds=receiver.timeout_seconds, retry_cap_seconds=cap)


def receivers(notifier: ResolvedNotifier) -> dict[str, Receiver]:
    """Each configured receiver, ready for ``outbox.send_due``."""
    return {name: _renderer(r, notifier.max_retry_interval) for name, r in notifier.receivers.items()}


def deliveries_of(session: Session, alert: AlertRow) -> Sequence[NotificationDelivery]:
    """The deliveries that carried an alert, oldest first (for ``GET /v1/alerts/{id}``)."""
    rows = session.scalars(select(NotificationDelivery).where(NotificationDelivery.created_at >= alert.starts_at)
                           .order_by(NotificationDelivery.id))
    return [d for d in rows if d.alert_id == alert.id or alert.id in (d.alert_ids or [])]
