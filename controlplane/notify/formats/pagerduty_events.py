"""PagerDuty's Events API v2: one PagerDuty alert per group (``dedup_key``), resolved only when the whole group
is; kept under the API's 512 KB by leaving out the largest custom details."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from controlplane.notify.formats.common import (
    JSON_HEADERS,
    alert_text,
    alertname,
    by_urgency,
    clip,
    console_link,
    encode,
    is_absolute,
    jsonable,
    one_line,
    rfc3339,
    runbook_link,
    strings,
    units,
)
from controlplane.notify.model import AlertView, Notification, Request, Severity

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
# PagerDuty's limit is 512 KB; 512,000 bytes is under it whichever way a kilobyte is counted.
PAGERDUTY_MAX_BYTES = 512_000
PAGERDUTY_SUMMARY_MAX = 1024
PAGERDUTY_SEVERITY: dict[Severity, str] = {"page": "critical", "warning": "warning", "info": "info"}


def dedup_key(n: Notification) -> str:
    """One PagerDuty alert per group: repeats and the resolve merge into it (64 hex digits, within 255)."""
    return hashlib.sha256(n.group_key.encode("utf-8", "replace")).hexdigest()


def pagerduty(n: Notification, *, routing_key: str, now: datetime, url: str = PAGERDUTY_URL) -> Request:
    """A trigger while any alert of the group fires; a bare resolve (key, action, dedup key) once none does."""
    if not routing_key:
        raise ValueError("PagerDuty receiver has no routing_key")
    ok = frozenset({202})
    if n.status == "resolved":
        event: dict[str, Any] = {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key(n)}
        return Request(url=url, body=encode(event), headers=dict(JSON_HEADERS), ok=ok)

    ordered = by_urgency(n.alerts)
    worst = ordered[0]
    labels = worst.labels
    payload: dict[str, Any] = {
        "summary": _pd_summary(worst, firing=len(n.firing)),
        "source": labels.get("node") or labels.get("model") or "pitstop",
        "severity": PAGERDUTY_SEVERITY[worst.severity],
        "timestamp": rfc3339(worst.starts_at),
    }
    for key, label in (("component", "model"), ("group", "node"), ("class", "alertname")):
        if labels.get(label):
            payload[key] = labels[label]
    details = _pd_details(n, ordered, now)
    payload["custom_details"] = details
    event = {"routing_key": routing_key, "event_action": "trigger", "dedup_key": dedup_key(n), "payload": payload}
    links = [{"href": href, "text": text}
             for href, text in ((console_link(worst, n), "Pitstop console"), (runbook_link(worst), "Runbook")) if href]
    if links:
        event["links"] = links
    event["client"] = "Pitstop"
    if is_absolute(n.external_url):
        event["client_url"] = n.external_url
    return Request(url=url, body=_fit(event, details), headers=dict(JSON_HEADERS), ok=ok)


def _pd_summary(worst: AlertView, *, firing: int) -> str:
    """The worst alert and what Pitstop did about it; a long alert text is cut so that the action still shows."""
    action = one_line(worst.action_summary)
    tail = f" — Pitstop: {clip(action, 400)}" if action else " — Pitstop took no action"
    prefix = f"[{firing} firing] " if firing > 1 else ""
    text = alert_text(worst)
    head = alertname(worst) + (f": {text}" if text else "")
    return prefix + clip(head, PAGERDUTY_SUMMARY_MAX - units(prefix) - units(tail)) + tail


def _pd_details(n: Notification, ordered: list[AlertView], now: datetime) -> dict[str, Any]:
    """One entry for the group, one per alert and one per alert's evidence: entries are what ``_fit`` leaves out,
    so a huge evidence goes before the alert it belongs to."""
    details: dict[str, Any] = {
        "group": {
            "receiver": n.receiver, "group_labels": strings(n.group_labels), "firing": len(n.firing),
            "resolved": len(n.resolved), "truncated_alerts": n.truncated_alerts, "notified_at": rfc3339(now),
            "console": n.external_url,
        },
    }
    width = len(str(len(ordered)))
    for i, a in enumerate(ordered, 1):
        name = f"alert {i:0{width}d} {alertname(a)}"
        details[name] = {
            "status": a.status, "severity": a.severity, "labels": strings(a.labels),
            "annotations": strings(a.annotations), "pitstop_action": a.action_summary,
            "starts_at": rfc3339(a.starts_at), "ends_at": rfc3339(a.ends_at) if a.ends_at else None,
            "console": a.generator_url, "fingerprint": a.fingerprint,
        }
        if a.evidence:
            details[f"{name} evidence"] = jsonable(a.evidence)
    return details


def _fit(event: dict[str, Any], details: dict[str, Any], limit: int = PAGERDUTY_MAX_BYTES) -> bytes:
    """The event's body under ``limit`` bytes, leaving out custom details entries, the largest first."""
    body = encode(event)
    if len(body) <= limit:
        return body
    size = {k: len(encode({k: v})) for k, v in details.items()}
    order = sorted(details, key=lambda k: (-size[k], k))
    excess = len(body) - limit + 4096  # room for the note saying what was left out
    dropped: list[str] = []
    for k in order:
        if excess <= 0:
            break
        dropped.append(k)
        excess -= size[k]
    while True:
        left_out = set(dropped)
        kept = {k: v for k, v in details.items() if k not in left_out}
        kept["truncated"] = clip(
            f"{len(dropped)} of {len(details)} entries left out to keep the event under PagerDuty's 512 KB "
            f"(largest first): " + ", ".join(dropped), 2000)
        event["payload"]["custom_details"] = kept
        body = encode(event)
        if len(body) <= limit or len(dropped) == len(order):
            return body
        dropped.append(order[len(dropped)])
