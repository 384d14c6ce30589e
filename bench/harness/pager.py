"""A PagerDuty Events API v2 endpoint on loopback: every event kept with its wall-clock arrival; answers 202.

What Pitstop's ``pagerduty`` receiver posts to when its ``url`` points here (``202`` is the only answer the
outbox counts as sent, as PagerDuty's). An event's alerts are read back from its ``custom_details`` (one entry
per alert of the group, ``alert NN <alertname>``), so a benchmark can tell which fault a page is about.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.harness.receiver import Answer, LoopbackReceiver


@dataclass(frozen=True)
class PagerEvent:
    """One Events v2 body as it arrived, with the receiver's wall-clock arrival time and its size."""

    at: float
    body: dict[str, Any]
    size: int

    @property
    def action(self) -> str:
        return str(self.body.get("event_action", ""))

    @property
    def dedup_key(self) -> str:
        return str(self.body.get("dedup_key", ""))

    @property
    def details(self) -> dict[str, Any]:
        details: dict[str, Any] = (self.body.get("payload") or {}).get("custom_details") or {}
        return details

    @property
    def group_labels(self) -> dict[str, str]:
        labels: dict[str, str] = (self.details.get("group") or {}).get("group_labels") or {}
        return labels

    def alerts(self) -> list[dict[str, Any]]:
        """The alert entries the event carries (their evidence entries and the group entry left out)."""
        return [v for k, v in self.details.items()
                if k.startswith("alert ") and not k.endswith(" evidence") and isinstance(v, dict)]


class PagerDutyReceiver(LoopbackReceiver):
    """Loopback Events v2 endpoint; ``url`` goes in a ``pagerduty`` receiver's ``url``."""

    def __init__(self, code: int = 202) -> None:
        self.events: list[PagerEvent] = []
        self.code = code
        super().__init__("/v2/enqueue", self._receive)

    def _receive(self, at: float, raw: bytes) -> Answer:
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"unreadable": raw[:200].decode(errors="replace")}
        self.events.append(PagerEvent(at, body, len(raw)))
        return self.code, {"Content-Type": "application/json"}, b'{"status":"success","message":"Event processed"}'

    def triggers(self) -> list[PagerEvent]:
        return [e for e in list(self.events) if e.action == "trigger"]

    def first_trigger(self, wanted: Callable[[dict[str, Any]], bool]) -> PagerEvent | None:
        """The earliest trigger carrying a firing alert for which ``wanted(alert entry)`` holds."""
        for event in self.triggers():
            if any(a.get("status") == "firing" and wanted(a) for a in event.alerts()):
                return event
        return None

    def alertnames(self) -> list[str]:
        """Each trigger's alerts as ``alertname target (model)``, in arrival order (what the run was paged
        about)."""
        out = []
        for e in self.triggers():
            for a in e.alerts():
                labels = a.get("labels") or {}
                out.append(f"{labels.get('alertname', '')} {labels.get('target', '')} ({labels.get('model', '-')})")
        return out
