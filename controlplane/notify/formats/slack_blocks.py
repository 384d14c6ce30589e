"""A Slack incoming-webhook message in Block Kit: a header, one section per alert (what fired, what Pitstop did,
links to the console and the runbook), within Slack's block and text limits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.notify.formats.common import (
    JSON_HEADERS,
    alert_text,
    alertname,
    as_utc,
    by_urgency,
    clip,
    console_link,
    encode,
    is_absolute,
    one_line,
    rfc3339,
    runbook_link,
    units,
)
from controlplane.notify.model import AlertView, Notification, Request, Severity

SLACK_MAX_BLOCKS = 50
SLACK_HEADER_MAX = 150
SLACK_TEXT_MAX = 3000  # a section's or context element's text object
SLACK_FALLBACK_MAX = 3000  # the top-level text: Slack allows more, but a notification shows only its start
# Longer console or runbook links are left out of a section rather than crowd its text out.
SLACK_URL_MAX = 400
EMOJI: dict[Severity, str] = {"page": "🔴", "warning": "🟠", "info": "🔵"}
RESOLVED_EMOJI = "✅"


def slack(n: Notification, *, url: str, now: datetime) -> Request:
    """A header, a context line for the group, then one section per alert, the most urgent first, while blocks
    last; a closing context counts the alerts left out (and those the notifier already left out)."""
    ordered = by_urgency(n.alerts)
    status = n.status
    counted = n.firing if status == "firing" else n.resolved
    emoji = EMOJI[ordered[0].severity] if status == "firing" else RESOLVED_EMOJI
    title = alertname(ordered[0]) if ordered else n.receiver
    more = f" (+{len(counted) - 1} more)" if len(counted) > 1 else ""
    header = clip(one_line(f"{emoji} {status.upper()}: {title}{more}"), SLACK_HEADER_MAX)

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
                                  if is_absolute(n.external_url) else "")))
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
    if is_absolute(n.external_url) and len(_url(n.external_url)) <= SLACK_URL_MAX:
        parts.append(f"<{_url(n.external_url)}|Pitstop console>")
    return " · ".join(parts)


def _when(t: datetime) -> str:
    """A time Slack shows in the reader's own timezone, with RFC 3339 where it cannot."""
    return f"<!date^{int(as_utc(t).timestamp())}^{{date_short_pretty}} {{time}}|{rfc3339(t)}>"


def _section(a: AlertView, n: Notification) -> str:
    """What fired, where, what Pitstop did, and where to look: each part has its budget, so all of them show."""
    if a.status == "firing":
        emoji, state = EMOJI[a.severity], f"{a.severity}, firing since {_when(a.starts_at)}"
    else:
        emoji, state = RESOLVED_EMOJI, f"resolved {_when(a.ends_at)}" if a.ends_at else "resolved"
    lines = [f"{emoji} *{clip(_esc(one_line(alertname(a))), 120, mrkdwn=True)}* · {state}"]
    where = [f"`{_esc(k)}={_esc(v)}`" for k, v in sorted(a.labels.items()) if k not in ("alertname", "severity")]
    if where:
        lines.append(clip(" ".join(where), 250, mrkdwn=True))
    if text := alert_text(a):
        lines.append(clip(_esc(text), 900, mrkdwn=True))
    action = one_line(a.action_summary)
    lines.append(clip(f"*Pitstop:* {_esc(action)}", 600, mrkdwn=True) if action else "_Pitstop took no action._")
    links = []
    for href, label in ((console_link(a, n), "Console"), (runbook_link(a), "Runbook")):
        if href and len(_url(href)) <= SLACK_URL_MAX:
            links.append(f"<{_url(href)}|{label}>")
    if not runbook_link(a):
        links.append("no runbook")
    lines.append(" · ".join(links))
    return clip("\n".join(lines), SLACK_TEXT_MAX, mrkdwn=True)


def _fallback(n: Notification, ordered: list[AlertView], emoji: str) -> str:
    """The top-level text: what notifications and clients without blocks show."""
    if not ordered:
        return f"{emoji} RESOLVED: {n.receiver}"
    worst = ordered[0]
    count = len(n.firing) if n.status == "firing" else len(n.resolved)
    text = alert_text(worst)
    action = one_line(worst.action_summary)
    line = f"{emoji} [{n.status.upper()}:{count}] {alertname(worst)}" + (f": {text}" if text else "")
    tail = f" — Pitstop: {clip(action, 600)}" if action else ""
    return clip(_esc(line), SLACK_FALLBACK_MAX - units(_esc(tail)), mrkdwn=True) + _esc(tail)
