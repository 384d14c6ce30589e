"""Alerts raised by remediation, and their lifecycle: fire, stay one alert while firing, resolve when clear.

An alert action (a policy's ``alert``, its ``notify``, the breaker's page) fires an alert row identified by its
labels' fingerprint; while that alert fires, a repeat only refreshes it (its latest action, evidence and
``last_seen_at``). Every policy round ``sync`` resolves what cleared: a policy's alert once the policy stopped
proposing it for its condition's ``for:`` (``clear_after``), an alert on a replica that is gone, or on a policy
no longer loaded. The breaker's page resolves when an operator resets the breaker. A breach that comes back
after resolving is a new alert, and pages again. Delivery is the notifier's (``controlplane/notify``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.notify.lifecycle import FIRING, NOTIFIER_POLICY, RESOLVED, fingerprint, resolve
from controlplane.policy.payloads import AlertPayload
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction
from controlplane.policy.snapshot import ALERTMANAGER_POLICY, FleetSnapshot
from controlplane.store.models import ActionRow, AlertRow

BREAKER_POLICY = "circuit-breaker"
# Alerts raised by something other than a loaded policy: ``sync`` leaves them alone.
NOT_A_POLICY = frozenset({BREAKER_POLICY, ALERTMANAGER_POLICY, NOTIFIER_POLICY})
__all__ = ["BREAKER_POLICY", "FIRING", "RESOLVED", "fingerprint", "raise_alert", "resolve", "resolve_breaker_page",
           "sync"]


def raise_alert(*, session: Session, action: ActionRow, payload: AlertPayload, now: datetime,
                summary: str | None = None) -> AlertRow:
    """Fire the alert of ``action``, or refresh it while the same alert (same labels) still fires."""
    severity = payload.severity
    labels = {"alertname": f"pitstop-{action.policy or 'operator'}", "target": action.target,
              "severity": severity}
    if action.model:
        labels["model"] = action.model
    if action.node:
        labels["node"] = action.node
    if action.replica:
        labels["replica"] = action.replica
    annotations: dict[str, Any] = {
        "summary": summary or action.reason, "action_id": action.id, "evidence": list(action.evidence),
        "runbook_url": payload.runbook_url,
    }
    key = fingerprint(labels)
    firing = session.scalars(select(AlertRow).where(AlertRow.fingerprint == key, AlertRow.state == FIRING)
                             .order_by(AlertRow.id.desc()).limit(1)).first()
    if firing is not None:
        firing.annotations, firing.action_id = annotations, action.id
        firing.last_seen_at = firing.updated_at = now
        session.flush()
        return firing
    alert = AlertRow(fingerprint=key, labels=labels, annotations=annotations, severity=severity, state=FIRING,
                     starts_at=now, ends_at=None, action_id=action.id, updated_at=now, last_seen_at=now,
                     policy=action.policy, resolved_reason="")
    session.add(alert)
    session.flush()
    return alert


def sync(*, session: Session, proposals: Sequence[ProposedAction], snapshot: FleetSnapshot,
         policies: Mapping[str, Policy], now: datetime,
         owns: Callable[[Policy | None, dict[str, Any]], bool] = lambda _policy, _labels: True) -> list[int]:
    """Refresh the alerts the policies still propose and resolve the ones that cleared; the ids resolved.

    ``proposals`` are every action the policies propose this round, before the guardrails: an alert held
    back by its cooldown still holds. ``owns``: whether an alert is this round's to keep or resolve (rounds
    spread over shards: ``Part.owns_alert``); the others' alerts are left as they are.
    """
    active = {(a.policy, a.target.key) for a in proposals if isinstance(a.payload, AlertPayload)}
    replicas = {f"replica:{r.key}" for r in snapshot.replicas}
    resolved = []
    for alert in session.scalars(select(AlertRow).where(AlertRow.state == FIRING)):
        target = str(alert.labels.get("target", ""))
        policy = alert.policy
        if policy is None or policy in NOT_A_POLICY:
            # Not a policy's: an operator resolves these (the breaker's page by resetting the breaker),
            # Alertmanager its own, the notifier its own.
            continue
        if (policy, target) in active:
            alert.last_seen_at = now
            continue
        if not owns(policies.get(policy), alert.labels):
            continue
        why = _cleared(policies.get(policy), alert, target, replicas, now)
        if why is not None:
            resolve(alert=alert, now=now, reason=why)
            resolved.append(alert.id)
    session.flush()
    return resolved


def _cleared(policy: Policy | None, alert: AlertRow, target: str, replicas: set[str], now: datetime) -> str | None:
    if target.startswith("replica:") and target not in replicas:
        return f"{target.removeprefix('replica:')} is gone"
    if policy is None or not policy.enabled:
        return f"policy {alert.policy} is no longer running"
    clear = timedelta(seconds=policy.condition.clear_after)
    seen = alert.last_seen_at or alert.starts_at
    if now - seen >= clear:
        return f"{policy.name}'s condition clear for {clear.total_seconds():g}s"
    return None


def resolve_breaker_page(*, session: Session, now: datetime, by: str) -> list[int]:
    """The breaker was reset: its page resolves."""
    pages = list(session.scalars(select(AlertRow).where(AlertRow.state == FIRING, AlertRow.policy == BREAKER_POLICY)))
    for alert in pages:
        resolve(alert=alert, now=now, reason=f"circuit breaker reset by {by}")
    return [a.id for a in pages]
