"""Pitstop's own webhook, signed with HMAC-SHA256 (``signing.py``). Its JSON, version "1"::

    {"version": "1", "status": "firing" | "resolved", "receiver": str, "group_key": str,
     "group_labels": {str: str}, "truncated_alerts": int, "external_url": str,
     "alerts": [{"fingerprint": str, "status": "firing" | "resolved", "severity": "info" | "warning" | "page",
                 "labels": {str: str}, "annotations": {str: str}, "starts_at": RFC 3339,
                 "ends_at": RFC 3339 | null (null while firing), "generator_url": str, "action_summary": str,
                 "evidence": {str: JSON}}]}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.notify.formats.common import JSON_HEADERS, as_utc, encode, jsonable, rfc3339, strings
from controlplane.notify.model import Notification, Request
from controlplane.notify.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign


def pitstop_payload(n: Notification) -> dict[str, Any]:
    """The Pitstop webhook's JSON (see the module's docstring)."""
    return {
        "version": "1",
        "status": n.status,
        "receiver": n.receiver,
        "group_key": n.group_key,
        "group_labels": strings(n.group_labels),
        "truncated_alerts": n.truncated_alerts,
        "external_url": n.external_url,
        "alerts": [{
            "fingerprint": a.fingerprint, "status": a.status, "severity": a.severity,
            "labels": strings(a.labels), "annotations": strings(a.annotations),
            "starts_at": rfc3339(a.starts_at), "ends_at": rfc3339(a.ends_at) if a.ends_at else None,
            "generator_url": a.generator_url, "action_summary": a.action_summary, "evidence": jsonable(a.evidence),
        } for a in n.alerts],
    }


def webhook(n: Notification, *, url: str, secret: bytes | str, now: datetime) -> Request:
    """Pitstop's JSON, signed over ``"<timestamp>.<body>"`` with the receiver's secret (``signing.verify``)."""
    key = secret.encode() if isinstance(secret, str) else secret
    body = encode(pitstop_payload(n))
    timestamp = int(as_utc(now).timestamp())
    headers = {**JSON_HEADERS, TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(key, timestamp, body)}
    return Request(url=url, body=body, headers=headers)
