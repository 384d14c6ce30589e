"""Receivers' formats: a notification in, the tool's HTTP request out. Pure: no network, files or clock.

Each format follows its tool's public contract and keeps within that tool's limits, cutting text with an
ellipsis and leaving out what does not fit (and saying so) rather than sending a message the tool refuses:

- ``alertmanager_webhook``: Alertmanager's webhook payload, version 4, so whatever takes Alertmanager's webhook
  takes Pitstop's; what Pitstop did rides along as the ``pitstop_action`` annotation.
- ``pagerduty``: an Events API v2 event, one PagerDuty alert per group (``dedup_key``), resolved only when the
  whole group is; kept under the API's 512 KB by leaving out the largest custom details.
- ``slack``: an incoming-webhook message in Block Kit: a header, one section per alert (what fired, what Pitstop
  did, links to the console and the runbook), within Slack's block and text limits.
- ``webhook``: Pitstop's own JSON, signed with HMAC-SHA256 (``signing.py``). Its shape, version "1"::

    {"version": "1", "status": "firing" | "resolved", "receiver": str, "group_key": str,
     "group_labels": {str: str}, "truncated_alerts": int, "external_url": str,
     "alerts": [{"fingerprint": str, "status": "firing" | "resolved", "severity": "info" | "warning" | "page",
                 "labels": {str: str}, "annotations": {str: str}, "starts_at": RFC 3339,
                 "ends_at": RFC 3339 | null (null while firing), "generator_url": str, "action_summary": str,
                 "evidence": {str: JSON}}]}

Bodies are compact UTF-8 JSON. Times are RFC 3339 in UTC; a naive datetime is taken as UTC (what SQLite gives
back). Non-finite numbers in evidence become strings, since JSON has no NaN.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from controlplane.notify.model import AlertView, Notification, Request, Severity
from controlplane.notify.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

Kind = Literal["alertmanager_webhook", "pagerduty", "slack", "webhook"]

JSON_HEADERS = {"Content-Type": "application/json"}
ELLIPSIS = "…"
# Alertmanager's "not ended" time, which it sends as a firing alert's endsAt.
ZERO_TIME = "0001-01-01T00:00:00Z"
# The annotation carrying what Pitstop did, for tools that only know Alertmanager's payload.
ACTION_ANNOTATION = "pitstop_action"

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
# PagerDuty's limit is 512 KB; 512,000 bytes is under it whichever way a kilobyte is counted.
PAGERDUTY_MAX_BYTES = 512_000
PAGERDUTY_SUMMARY_MAX = 1024
PAGERDUTY_SEVERITY: dict[Severity, str] = {"page": "critical", "warning": "warning", "info": "info"}

SLACK_MAX_BLOCKS = 50
SLACK_HEADER_MAX = 150
SLACK_TEXT_MAX = 3000  # a section's or context element's text object
SLACK_FALLBACK_MAX = 3000  # the top-level text: Slack allows more, but a notification shows only its start
# Longer console or runbook links are left out of a section rather than crowd its text out.
SLACK_URL_MAX = 400
EMOJI: dict[Severity, str] = {"page": "🔴", "warning": "🟠", "info": "🔵"}
RESOLVED_EMOJI = "✅"

_RANK: dict[Severity, int] = {"info": 0, "warning": 1, "page": 2}


# -- shared -----------------------------------------------------------------------------------------------------


def encode(obj: object) -> bytes:
    """Compact UTF-8 JSON: the exact bytes sent (and signed)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8", "replace")  # a lone surrogate becomes "?" rather than failing the delivery


def rfc3339(t: datetime) -> str:
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


def _strings(m: Mapping[str, object]) -> dict[str, str]:
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


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _absolute(url: str) -> bool:
    return url.startswith(("https://", "http://"))


def _by_urgency(alerts: Sequence[AlertView]) -> list[AlertView]:
    """Firing before resolved, the worst severity first, then the longest-running: the first is the headline."""
    return sorted(alerts, key=lambda a: (a.status != "firing", -_RANK[a.severity], _utc(a.starts_at)))


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def _alertname(a: AlertView) -> str:
    return a.labels.get("alertname") or "alert"


def _text(a: AlertView) -> str:
    return _one_line(a.annotations.get("summary") or a.annotations.get("description") or "")


def _console(a: AlertView, n: Notification) -> str:
    url = a.generator_url or n.external_url
    return url if _absolute(url) else ""


def _runbook(a: AlertView) -> str:
    url = a.annotations.get("runbook_url") or ""
    return url if _absolute(url) else ""


# -- Alertmanager webhook, version 4 ----------------------------------------------------------------------------


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
        "groupLabels": _strings(n.group_labels),
        "commonLabels": _strings(n.common_labels),
        "commonAnnotations": _strings(n.common_annotations),
        "externalURL": n.external_url,
        "alerts": [_am_alert(a, now) for a in alerts],
    }
    return Request(url=url, body=encode(body), headers=dict(JSON_HEADERS))


def _am_alert(a: AlertView, now: datetime) -> dict[str, Any]:
    annotations = _strings(a.annotations)
    if a.action_summary:
        annotations[ACTION_ANNOTATION] = a.action_summary
    ends = ZERO_TIME if a.status == "firing" else rfc3339(a.ends_at if a.ends_at is not None else now)
    return {
        "status": a.status,
        "labels": _strings(a.labels),
        "annotations": annotations,
        "startsAt": rfc3339(a.starts_at),
        "endsAt": ends,
        "generatorURL": a.generator_url,
        "fingerprint": a.fingerprint,
    }


# -- PagerDuty Events API v2 ------------------------------------------------------------------------------------


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

    ordered = _by_urgency(n.alerts)
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
             for href, text in ((_console(worst, n), "Pitstop console"), (_runbook(worst), "Runbook")) if href]
    if links:
        event["links"] = links
    event["client"] = "Pitstop"
    if _absolute(n.external_url):
        event["client_url"] = n.external_url
    return Request(url=url, body=_fit(event, details), headers=dict(JSON_HEADERS), ok=ok)


def _pd_summary(worst: AlertView, *, firing: int) -> str:
    """The worst alert and what Pitstop did about it; a long alert text is cut so that the action still shows."""
    action = _one_line(worst.action_summary)
    tail = f" — Pitstop: {clip(action, 400)}" if action else " — Pitstop took no action"
    prefix = f"[{firing} firing] " if firing > 1 else ""
    text = _text(worst)
    head = _alertname(worst) + (f": {text}" if text else "")
    return prefix + clip(head, PAGERDUTY_SUMMARY_MAX - units(prefix) - units(tail)) + tail


def _pd_details(n: Notification, ordered: list[AlertView], now: datetime) -> dict[str, Any]:
    """One entry for the group, one per alert and one per alert's evidence: entries are what ``_fit`` leaves out,
    so a huge evidence goes before the alert it belongs to."""
    details: dict[str, Any] = {
        "group": {
            "receiver": n.receiver, "group_labels": _strings(n.group_labels), "firing": len(n.firing),
            "resolved": len(n.resolved), "truncated_alerts": n.truncated_alerts, "notified_at": rfc3339(now),
            "console": n.external_url,
        },
    }
    width = len(str(len(ordered)))
    for i, a in enumerate(ordered, 1):
        name = f"alert {i:0{width}d} {_alertname(a)}"
        details[name] = {
            "status": a.status, "severity": a.severity, "labels": _strings(a.labels),
            "annotations": _strings(a.annotations), "pitstop_action": a.action_summary,
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


# -- Slack incoming webhook, Block Kit --------------------------------------------------------------------------


def slack(n: Notification, *, url: str, now: datetime) -> Request:
    """A header, a context line for the group, then one section per alert, the most urgent first, while blocks
    last; a closing context counts the alerts left out (and those the notifier already left out)."""
    ordered = _by_urgency(n.alerts)
    status = n.status
    counted = n.firing if status == "firing" else n.resolved
    emoji = EMOJI[ordered[0].severity] if status == "firing" else RESOLVED_EMOJI
    title = _alertname(ordered[0]) if ordered else n.receiver
    more = f" (+{len(counted) - 1} more)" if len(counted) > 1 else ""
    header = clip(_one_line(f"{emoji} {status.upper()}: {title}{more}"), SLACK_HEADER_MAX)

    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header, "emoji": True}},
        _context(_group_line(n)),
    ]
    room = SLACK_MAX_BLOCKS - len(blocks)
    hidden = n.truncated_alerts
    shown = ordered
    if len(ordered) > room or (hidden and len(ordered) == room):
        shown = ordered[:room - 1]
        hidden += len(ordered) - len(shown)
    blocks += [{"type": "section", "text": {"type": "mrkdwn", "text": _section(a, n)}} for a in shown]
    if hidden:
        blocks.append(_context(f"… and {hidden} more alert{'s' if hidden != 1 else ''}"
                               + (f" in <{_url(n.external_url)}|the Pitstop console>"
                                  if _absolute(n.external_url) else "")))
    body = {"text": _fallback(n, ordered, emoji), "blocks": blocks}
    return Request(url=url, body=encode(body), headers=dict(JSON_HEADERS), ok=frozenset({200}))


def _esc(text: str) -> str:
    """Slack's three control characters in mrkdwn."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _url(url: str) -> str:
    """A URL inside ``<url|label>``: its ``|``, ``<`` and ``>`` would end the link early."""
    return url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(text, SLACK_TEXT_MAX, mrkdwn=True)}]}


def _group_line(n: Notification) -> str:
    parts = [f"*{len(n.firing)}* firing", f"*{len(n.resolved)}* resolved"]
    if n.group_labels:
        parts.append(" ".join(f"`{_esc(k)}={_esc(v)}`" for k, v in sorted(n.group_labels.items())))
    if _absolute(n.external_url) and len(_url(n.external_url)) <= SLACK_URL_MAX:
        parts.append(f"<{_url(n.external_url)}|Pitstop console>")
    return " · ".join(parts)


def _when(t: datetime) -> str:
    """A time Slack shows in the reader's own timezone, with RFC 3339 where it cannot."""
    return f"<!date^{int(_utc(t).timestamp())}^{{date_short_pretty}} {{time}}|{rfc3339(t)}>"


def _section(a: AlertView, n: Notification) -> str:
    """What fired, where, what Pitstop did, and where to look: each part has its budget, so all of them show."""
    if a.status == "firing":
        emoji, state = EMOJI[a.severity], f"{a.severity}, firing since {_when(a.starts_at)}"
    else:
        emoji, state = RESOLVED_EMOJI, f"resolved {_when(a.ends_at)}" if a.ends_at else "resolved"
    lines = [f"{emoji} *{clip(_esc(_one_line(_alertname(a))), 120, mrkdwn=True)}* · {state}"]
    where = [f"`{_esc(k)}={_esc(v)}`" for k, v in sorted(a.labels.items()) if k not in ("alertname", "severity")]
    if where:
        lines.append(clip(" ".join(where), 250, mrkdwn=True))
    if text := _text(a):
        lines.append(clip(_esc(text), 900, mrkdwn=True))
    action = _one_line(a.action_summary)
    lines.append(clip(f"*Pitstop:* {_esc(action)}", 600, mrkdwn=True) if action else "_Pitstop took no action._")
    links = []
    for href, label in ((_console(a, n), "Console"), (_runbook(a), "Runbook")):
        if href and len(_url(href)) <= SLACK_URL_MAX:
            links.append(f"<{_url(href)}|{label}>")
    if not _runbook(a):
        links.append("no runbook")
    lines.append(" · ".join(links))
    return clip("\n".join(lines), SLACK_TEXT_MAX, mrkdwn=True)


def _fallback(n: Notification, ordered: list[AlertView], emoji: str) -> str:
    """The top-level text: what notifications and clients without blocks show."""
    if not ordered:
        return f"{emoji} RESOLVED: {n.receiver}"
    worst = ordered[0]
    count = len(n.firing) if n.status == "firing" else len(n.resolved)
    text = _text(worst)
    action = _one_line(worst.action_summary)
    line = f"{emoji} [{n.status.upper()}:{count}] {_alertname(worst)}" + (f": {text}" if text else "")
    tail = f" — Pitstop: {clip(action, 600)}" if action else ""
    return clip(_esc(line), SLACK_FALLBACK_MAX - units(_esc(tail)), mrkdwn=True) + _esc(tail)


# -- Pitstop webhook, version 1 ---------------------------------------------------------------------------------


def pitstop_payload(n: Notification) -> dict[str, Any]:
    """The Pitstop webhook's JSON (see the module's docstring)."""
    return {
        "version": "1",
        "status": n.status,
        "receiver": n.receiver,
        "group_key": n.group_key,
        "group_labels": _strings(n.group_labels),
        "truncated_alerts": n.truncated_alerts,
        "external_url": n.external_url,
        "alerts": [{
            "fingerprint": a.fingerprint, "status": a.status, "severity": a.severity,
            "labels": _strings(a.labels), "annotations": _strings(a.annotations),
            "starts_at": rfc3339(a.starts_at), "ends_at": rfc3339(a.ends_at) if a.ends_at else None,
            "generator_url": a.generator_url, "action_summary": a.action_summary, "evidence": jsonable(a.evidence),
        } for a in n.alerts],
    }


def webhook(n: Notification, *, url: str, secret: bytes | str, now: datetime) -> Request:
    """Pitstop's JSON, signed over ``"<timestamp>.<body>"`` with the receiver's secret (``signing.verify``)."""
    key = secret.encode() if isinstance(secret, str) else secret
    body = encode(pitstop_payload(n))
    timestamp = int(_utc(now).timestamp())
    headers = {**JSON_HEADERS, TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(key, timestamp, body)}
    return Request(url=url, body=body, headers=headers)


FORMATS: dict[str, Callable[..., Request]] = {
    "alertmanager_webhook": alertmanager_webhook,
    "pagerduty": pagerduty,
    "slack": slack,
    "webhook": webhook,
}


def render(kind: Kind, n: Notification, *, now: datetime, **settings: Any) -> Request:
    """The request for a receiver of ``kind``; ``settings`` are that format's keyword arguments."""
    fmt = FORMATS.get(kind)
    if fmt is None:
        raise ValueError(f"unknown receiver kind {kind!r}; known: {', '.join(FORMATS)}")
    return fmt(n, now=now, **settings)
