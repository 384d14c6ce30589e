"""The console's Alerts section, as data: firing, muted and resolved alerts, and where each was delivered.

Muted (silenced or inhibited) alerts are listed too, saying by what: on-call must see what is being held back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from controlplane.console.client import _get
from controlplane.console.shaping import Json


def fetch_alerts(client: httpx.Client, *, limit: int = 100) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = _get(client, "/v1/alerts", {"limit": limit})
    return alerts


def fetch_alert(client: httpx.Client, alert_id: int) -> dict[str, Any]:
    """One alert with every delivery that carried it."""
    alert: dict[str, Any] = _get(client, f"/v1/alerts/{alert_id}")
    return alert


def _muted(alert: Json) -> str:
    parts = [f"silence #{s}" for s in alert.get("silenced_by") or []]
    parts += [f"alert #{i}" if isinstance(i, int) else str(i) for i in alert.get("inhibited_by") or []]
    return ", ".join(parts)


def _labels(alert: Json) -> Json:
    labels: Json = alert.get("labels") or {}
    return labels


def alert_rows(alerts: Sequence[Json]) -> list[dict[str, Any]]:
    """One row per alert: the firing ones first, each saying whether and why it is muted."""
    ordered = sorted(alerts, key=lambda a: (a.get("state") != "firing", -int(a.get("id") or 0)))
    return [{
        "id": a.get("id"), "state": a.get("state"), "alert": _labels(a).get("alertname"),
        "severity": a.get("severity"), "target": _labels(a).get("target"), "since": a.get("starts_at"),
        "muted by": _muted(a), "resolved": a.get("resolved_reason") or "",
        "summary": (a.get("annotations") or {}).get("summary", ""),
    } for a in ordered]


def delivery_rows(alert: Json) -> list[dict[str, Any]]:
    """Per notification that carried the alert: receiver, why it was sent, and how it went."""
    return [{
        "receiver": d.get("receiver"), "why": d.get("reason"), "status": d.get("status"),
        "attempts": d.get("attempt"), "answer": d.get("response_code"), "sent": d.get("sent_at"),
        "next try": d.get("next_retry_at"), "error": d.get("error") or "",
    } for d in alert.get("deliveries") or []]


# Labels a silence made from an alert matches on: the alert itself, not every alert of its severity.
SILENCE_LABELS = ("alertname", "target", "model", "node", "replica")


def matchers_for(alert: Json) -> list[str]:
    """Matchers that silence this alert (and its re-fires), prefilled in the silence form."""
    labels = _labels(alert)
    return [f'{name}="{labels[name]}"' for name in SILENCE_LABELS if labels.get(name)]


def parse_matcher_lines(text: str) -> list[str]:
    """One matcher per line from the form's text area; blank lines dropped (the API checks each)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def silence_rows(silences: Sequence[Json]) -> list[dict[str, Any]]:
    return [{"id": s.get("id"), "state": s.get("state"), "matchers": ", ".join(s.get("matchers") or []),
             "until": s.get("ends_at"), "by": s.get("created_by"), "comment": s.get("comment", ""),
             "expired by": s.get("expired_by") or ""} for s in silences]
