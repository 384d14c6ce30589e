"""Receivers' formats: a notification in, the tool's HTTP request out. Pure: no network, files or clock.

Each format follows its tool's public contract and keeps within that tool's limits, cutting text with an
ellipsis and leaving out what does not fit (and saying so) rather than sending a message the tool refuses. A
module per receiver type, each format named after that type:

- ``alertmanager_webhook`` (``alertmanager.py``): Alertmanager's webhook payload, version 4, so whatever takes
  Alertmanager's webhook takes Pitstop's; what Pitstop did rides along as the ``pitstop_action`` annotation.
- ``pagerduty`` (``pagerduty_events.py``): an Events API v2 event, one PagerDuty alert per group
  (``dedup_key``), resolved only when the whole group is; kept under the API's 512 KB by leaving out the
  largest custom details.
- ``slack`` (``slack_blocks.py``): an incoming-webhook message in Block Kit: a header, one section per alert
  (what fired, what Pitstop did, links to the console and the runbook), within Slack's block and text limits.
- ``webhook`` (``pitstop_webhook.py``): Pitstop's own JSON, version "1" (its shape is in that module's
  docstring), signed with HMAC-SHA256 (``signing.py``).

Bodies are compact UTF-8 JSON (``common.py`` holds what the formats share). Times are RFC 3339 in UTC; a naive
datetime is taken as UTC (what SQLite gives back). Non-finite numbers in evidence become strings, since JSON
has no NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from controlplane.notify.formats.alertmanager import alertmanager_webhook
from controlplane.notify.formats.pagerduty_events import pagerduty
from controlplane.notify.formats.pitstop_webhook import webhook
from controlplane.notify.formats.slack_blocks import slack
from controlplane.notify.model import Notification, Request

__all__ = ["FORMATS", "Kind", "alertmanager_webhook", "pagerduty", "render", "slack", "webhook"]

Kind = Literal["alertmanager_webhook", "pagerduty", "slack", "webhook"]

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
