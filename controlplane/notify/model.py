"""What a receiver is told: one notification per alert group, with what Pitstop already did about it. Pure.

The notifier builds these from the stored alerts of a group (``alerts`` rows) and hands one to a receiver's
format (``formats/``), which turns it into that tool's request. Times are timezone-aware UTC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Status = Literal["firing", "resolved"]
# Pitstop's own severities (a policy's ``notify`` and ``alert`` actions); formats map them to their tool's.
Severity = Literal["info", "warning", "page"]


@dataclass(frozen=True)
class AlertView:
    """One alert as receivers see it; ``labels`` identify it (``alertname``, ``severity``, ``model``, ``node``,
    ``replica``, ``target``...), ``annotations`` describe it (``summary``, ``description``, ``runbook_url``)."""

    fingerprint: str
    status: Status
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime | None = None
    # Absolute link to the console page of the action behind the alert (from ``external_url``).
    generator_url: str = ""
    severity: Severity = "warning"
    # What Pitstop already did: "restarted replica gpu-a/r2 at 03:12 after a stall; READY again at 03:13",
    # or "holding: the disruption budget would leave 1 of 3 READY". Empty when it did nothing.
    action_summary: str = ""
    # Figures behind the alert (the finding's measurements and last readings), for custom details.
    evidence: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Notification:
    """One group's message to one receiver: every alert of the group, firing and lately resolved."""

    receiver: str
    # Stable for the group (the route and its group_by labels' values): receivers merge repeats by it.
    group_key: str
    group_labels: Mapping[str, str]
    alerts: Sequence[AlertView]
    # The console's base URL, absolute (``external_url`` in the server config).
    external_url: str
    # Alerts left out to keep the message within the receiver's limits.
    truncated_alerts: int = 0

    @property
    def status(self) -> Status:
        """Firing while any alert of the group fires."""
        return "firing" if any(a.status == "firing" for a in self.alerts) else "resolved"

    @property
    def firing(self) -> list[AlertView]:
        return [a for a in self.alerts if a.status == "firing"]

    @property
    def resolved(self) -> list[AlertView]:
        return [a for a in self.alerts if a.status == "resolved"]

    @property
    def common_labels(self) -> dict[str, str]:
        """Labels every alert of the group has with the same value."""
        return _common([a.labels for a in self.alerts])

    @property
    def common_annotations(self) -> dict[str, str]:
        return _common([a.annotations for a in self.alerts])

    @property
    def severity(self) -> Severity:
        """The group's worst severity."""
        order: dict[Severity, int] = {"info": 0, "warning": 1, "page": 2}
        return max((a.severity for a in self.alerts), key=order.__getitem__, default="warning")


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


@dataclass(frozen=True)
class Request:
    """What a format asks to send: the receiver's HTTP request, body already encoded (signatures cover it)."""

    url: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    # Success codes for this tool (PagerDuty answers 202; others 200 or 204).
    ok: frozenset[int] = frozenset({200, 201, 202, 204})


def to_json(n: Notification) -> dict[str, object]:
    """The notification as the outbox keeps it (no secrets: those are the receiver's, added at send time)."""
    return {
        "receiver": n.receiver, "group_key": n.group_key, "group_labels": dict(n.group_labels),
        "external_url": n.external_url, "truncated_alerts": n.truncated_alerts,
        "alerts": [{
            "fingerprint": a.fingerprint, "status": a.status, "labels": dict(a.labels),
            "annotations": dict(a.annotations), "starts_at": a.starts_at.isoformat(),
            "ends_at": None if a.ends_at is None else a.ends_at.isoformat(), "generator_url": a.generator_url,
            "severity": a.severity, "action_summary": a.action_summary, "evidence": dict(a.evidence),
        } for a in n.alerts],
    }


def from_json(data: Mapping[str, Any]) -> Notification:
    """Back from the outbox; raises KeyError or ValueError on a row that is not a notification."""
    alerts = [AlertView(
        fingerprint=str(a["fingerprint"]), status=_status(a["status"]), labels=dict(a["labels"]),
        annotations=dict(a["annotations"]), starts_at=datetime.fromisoformat(a["starts_at"]),
        ends_at=None if a.get("ends_at") is None else datetime.fromisoformat(a["ends_at"]),
        generator_url=str(a.get("generator_url", "")), severity=_severity(a.get("severity", "warning")),
        action_summary=str(a.get("action_summary", "")), evidence=dict(a.get("evidence") or {}),
    ) for a in data["alerts"]]
    return Notification(receiver=str(data["receiver"]), group_key=str(data["group_key"]),
                        group_labels=dict(data["group_labels"]), alerts=alerts,
                        external_url=str(data["external_url"]), truncated_alerts=int(data.get("truncated_alerts", 0)))


def _status(value: object) -> Status:
    if value == "firing":
        return "firing"
    if value == "resolved":
        return "resolved"
    raise ValueError(f"alert status {value!r}")


def _severity(value: object) -> Severity:
    for known in ("info", "warning", "page"):
        if value == known:
            return known
    raise ValueError(f"severity {value!r}")
