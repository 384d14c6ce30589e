"""An alert's identity and its two states: the pieces remediation (which raises alerts) and the notifier (which
raises its own and tells receivers) share."""

from __future__ import annotations

import hashlib
from datetime import datetime

from controlplane.store.models import AlertRow

FIRING, RESOLVED = "firing", "resolved"
# The notifier's own alerts (Watchdog, NotificationsFailing).
NOTIFIER_POLICY = "pitstop-notifier"


def fingerprint(labels: dict[str, str]) -> str:
    """An alert's identity: its labels, in order (the same alert again has the same fingerprint)."""
    text = "\n".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def resolve(*, alert: AlertRow, now: datetime, reason: str) -> None:
    alert.state, alert.ends_at, alert.updated_at, alert.resolved_reason = RESOLVED, now, now, reason
