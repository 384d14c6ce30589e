"""Alerts raised by remediation: an alert row with the evidence, and a pending delivery for the notifier.

The notifier (webhook outbox) delivers pending rows; until it runs, the alert is on record and visible in
``GET /v1/alerts`` and the console, with the action that raised it.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from controlplane.policy.payloads import AlertPayload
from controlplane.store.models import ActionRow, AlertRow, NotificationDelivery

RECEIVER = "default"


def fingerprint(labels: dict[str, str]) -> str:
    text = "\n".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def raise_alert(*, session: Session, action: ActionRow, payload: AlertPayload, now: datetime,
                summary: str | None = None) -> AlertRow:
    """Record a firing alert for ``action`` and queue its delivery (status ``pending``)."""
    severity = payload.severity
    labels = {"alertname": f"pitstop-{action.policy or 'operator'}", "target": action.target,
              "severity": severity}
    if action.model:
        labels["model"] = action.model
    annotations: dict[str, Any] = {
        "summary": summary or action.reason, "action_id": action.id, "evidence": list(action.evidence),
        "runbook_url": payload.runbook_url,
    }
    alert = AlertRow(fingerprint=fingerprint(labels), labels=labels, annotations=annotations, severity=severity,
                     state="firing", starts_at=now, ends_at=None, action_id=action.id, updated_at=now)
    session.add(alert)
    session.flush()
    session.add(NotificationDelivery(alert_id=alert.id, receiver=RECEIVER, attempt=1, status="pending",
                                     response_code=None, error="", created_at=now, next_retry_at=now))
    session.flush()
    return alert
