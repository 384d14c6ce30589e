"""Alertmanager's webhook payload, version 4, so whatever takes Alertmanager's webhook takes Pitstop's; what
Pitstop did rides along as the ``pitstop_action`` annotation."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.notify.formats.common import JSON_HEADERS, encode, rfc3339, strings
from controlplane.notify.model import AlertView, Notification, Request

# Alertmanager's "not ended" time, which it sends as a firing alert's endsAt.
ZERO_TIME = "0001-01-01T00:00:00Z"
# The annotation carrying what Pitstop did, for tools that only know Alertmanager's payload.
ACTION_ANNOTATION = "pitstop_action"


def alertmanager_webhook(n: Notification, *, url: str, now: datetime, max_alerts: int = 0) -> Request:
    """Alertmanager's webhook payload. ``max_alerts`` (0: all) keeps the first alerts and counts the rest in
    ``truncatedAlerts``, as Alertmanager's own ``max_alerts`` does. A resolved alert without an end time ends
    ``now``."""
    alerts = list(n.alerts)
    truncated = n.truncated_alerts
    if max_alerts > 0 and len(alerts) > max_alerts:
        truncated += len(alerts) - max_alerts
        alerts = alerts[:max_alerts]
    body = {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": truncated,
        "status": n.status,
        "receiver": n.receiver,
        "groupLabels": strings(n.group_labels),
        "commonLabels": strings(n.common_labels),
        "commonAnnotations": strings(n.common_annotations),
        "externalURL": n.external_url,
        "alerts": [_am_alert(a, now) for a in alerts],
    }
    return Request(url=url, body=encode(body), headers=dict(JSON_HEADERS))


def _am_alert(a: AlertView, now: datetime) -> dict[str, Any]:
    annotations = strings(a.annotations)
    if a.action_summary:
        annotations[ACTION_ANNOTATION] = a.action_summary
    ends = ZERO_TIME if a.status == "firing" else rfc3339(a.ends_at if a.ends_at is not None else now)
    return {
        "status": a.status,
        "labels": strings(a.labels),
        "annotations": annotations,
        "startsAt": rfc3339(a.starts_at),
        "endsAt": ends,
        "generatorURL": a.generator_url,
        "fingerprint": a.fingerprint,
    }
