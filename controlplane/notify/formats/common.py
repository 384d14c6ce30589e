"""What the receivers' formats share: the exact bytes sent, times, text cut to a tool's limits, and the parts of
an alert that every format shows."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from controlplane.notify.model import AlertView, Notification, Severity

JSON_HEADERS = {"Content-Type": "application/json"}
ELLIPSIS = "…"

_RANK: dict[Severity, int] = {"info": 0, "warning": 1, "page": 2}


def encode(obj: object) -> bytes:
    """Compact UTF-8 JSON: the exact bytes sent (and signed)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8", "replace")  # a lone surrogate becomes "?" rather than failing the delivery


def rfc3339(t: datetime) -> str:
    """``t`` in RFC 3339, in UTC with a ``Z``; a naive datetime is taken as UTC."""
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return t.isoformat().replace("+00:00", "Z")


def jsonable(value: object) -> Any:
    """``value`` as plain JSON data: evidence may hold datetimes, tuples, sets or NaN, which JSON cannot."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def strings(m: Mapping[str, object]) -> dict[str, str]:
    """Label and annotation values are strings in every format; anything else is sent as its JSON."""
    return {str(k): v if isinstance(v, str) else json.dumps(jsonable(v), ensure_ascii=False) for k, v in m.items()}


def units(text: str) -> int:
    """Length in UTF-16 code units, what Slack counts: never less than the characters JSON Schema counts."""
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


def clip(text: str, limit: int, *, mrkdwn: bool = False) -> str:
    """``text`` within ``limit`` (UTF-16 units), an ellipsis marking the cut; with ``mrkdwn``, never inside an
    escaped ``&amp;``/``&lt;``/``&gt;``."""
    if units(text) <= limit:
        return text
    used, end = 0, len(text)
    for i, c in enumerate(text):
        used += 2 if ord(c) > 0xFFFF else 1
        if used > limit - 1:  # room for the ellipsis
            end = i
            break
    cut = text[:end]
    if mrkdwn:
        amp = cut.rfind("&")
        if amp >= 0 and ";" not in cut[amp:]:
            cut = cut[:amp]
    return cut.rstrip() + ELLIPSIS


def one_line(text: str) -> str:
    """``text`` with every run of whitespace, newlines included, made one space."""
    return " ".join(text.split())


def is_absolute(url: str) -> bool:
    """An http(s) URL: the only links a receiver, far from the console, can follow."""
    return url.startswith(("https://", "http://"))


def by_urgency(alerts: Sequence[AlertView]) -> list[AlertView]:
    """Firing before resolved, the worst severity first, then the longest-running: the first is the headline."""
    return sorted(alerts, key=lambda a: (a.status != "firing", -_RANK[a.severity], as_utc(a.starts_at)))


def as_utc(t: datetime) -> datetime:
    """A naive datetime (what SQLite gives back) marked UTC; an aware one as it is."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def alertname(a: AlertView) -> str:
    """The alert's name, "alert" when it has none."""
    return a.labels.get("alertname") or "alert"


def alert_text(a: AlertView) -> str:
    """What the alert says, on one line: its summary, else its description, else nothing."""
    return one_line(a.annotations.get("summary") or a.annotations.get("description") or "")


def console_link(a: AlertView, n: Notification) -> str:
    """The alert's page in the console, else the console itself; "" when neither is an absolute URL."""
    url = a.generator_url or n.external_url
    return url if is_absolute(url) else ""


def runbook_link(a: AlertView) -> str:
    """The alert's runbook; "" without an absolute one."""
    url = a.annotations.get("runbook_url") or ""
    return url if is_absolute(url) else ""
