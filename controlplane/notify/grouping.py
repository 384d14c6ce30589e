"""When an alert group is due a notification: Alertmanager's timers, except that a breach always pages. Pure.

A group (one receiver, one set of ``group_by`` label values) remembers what it last told its receiver: for each
alert, firing or resolved. Each tick decides whether to tell it again:

- **new**: an alert of the group fires that the receiver has not been told is firing. In a quiet group (the
  receiver knows of nothing firing in it) that is ``group_wait`` after it started. Joining an incident the
  receiver already has, it goes with the group's next update, ``group_interval`` after the last notification,
  as in Alertmanager: a storm of alerts over a few seconds is one page per group, not one per tick. A breach
  that recovered and came back is a new alert (a new row, the same fingerprint), and pages again at once, even
  before its resolve went out: Alertmanager 0.25 stays silent about such a re-breach until ``repeat_interval``
  when it comes back within ``group_interval`` of the group's last notification, and on-call would never hear
  that it came back.
- **resolved**: an alert the receiver was told is firing has resolved, ``group_interval`` after the last
  notification (resolves of one group go out together), when the receiver wants resolves.
- **repeat**: alerts still fire and nothing changed for ``repeat_interval``.

Flapping is bounded upstream: an alert resolves only after its policy's condition stayed clear for its ``for:``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from controlplane.notify.model import Status

Reason = Literal["new", "resolved", "repeat"]


@dataclass(frozen=True)
class Member:
    """An alert of the group, as stored."""

    alert_id: int
    status: Status
    starts_at: datetime
    fingerprint: str = ""


@dataclass(frozen=True)
class Timing:
    group_wait: timedelta
    group_interval: timedelta
    repeat_interval: timedelta
    send_resolved: bool = True


@dataclass(frozen=True)
class GroupState:
    """What the group last told its receiver: when, and each alert's status then."""

    last_sent_at: datetime | None = None
    told: Mapping[int, Status] | None = None


def members_to_tell(state: GroupState, alerts: Sequence[Member]) -> list[Member]:
    """The alerts a notification of the group carries: every firing one, and the resolved ones the receiver
    was told were firing (once told resolved, an alert leaves the group)."""
    told = state.told or {}
    return [a for a in alerts if a.status == "firing" or told.get(a.alert_id) == "firing"]


def due(state: GroupState, alerts: Sequence[Member], timing: Timing, now: datetime) -> Reason | None:
    """Why the group is due a notification now, or None."""
    told = state.told or {}
    last = state.last_sent_at
    untold = [a for a in alerts if a.status == "firing" and told.get(a.alert_id) != "firing"]
    if untold and now >= min(a.starts_at for a in untold) + timing.group_wait:
        incident = any(s == "firing" for s in told.values())
        ended = {a.fingerprint for a in alerts if a.status == "resolved" and told.get(a.alert_id) == "firing"}
        back = any(a.fingerprint and a.fingerprint in ended for a in untold)
        if not incident or back or last is None or now >= last + timing.group_interval:
            return "new"
    gone = [a for a in alerts if a.status == "resolved" and told.get(a.alert_id) == "firing"]
    if gone and timing.send_resolved and (last is None or now >= last + timing.group_interval):
        return "resolved"
    firing = [a for a in alerts if a.status == "firing"]
    if firing and not untold and last is not None and now >= last + timing.repeat_interval:
        return "repeat"
    return None


def after_telling(told: Sequence[Member]) -> dict[int, Status]:
    """The group's memory once ``told`` went out: resolved alerts are told for good and forgotten."""
    return {a.alert_id: a.status for a in told if a.status == "firing"}
