"""Silences and inhibition: which firing alerts are muted now, and why. Pure.

A **silence** is an operator's "I know, stop telling me": Alertmanager's matchers, all of which must match an
alert's labels (an absent label reads as ""), over a window. It applies from ``starts_at`` up to, not
including, ``ends_at``: at ``ends_at`` it has expired, so the next notification goes out on time. Expiring one
by hand moves its ``ends_at`` to that moment.

**Inhibition** is the fleet explaining an alert: its cause is already known, so the symptom is noise.

- A firing hardware XID alert (``pitstop-xid-hardware``) on a node, a cordoned node, or an unreachable node
  (no report for ``stale_after``: stale) inhibits the alerts of the replicas on that node, their SLO alerts
  included; they are matched by the alert's ``node`` label. Alerts on the node itself or its GPUs are causes,
  not symptoms, and are left alone.
- A hot GPU (a firing ``pitstop-thermal`` or ``pitstop-thermal-sustained`` alert, its target ``gpu:node/index``)
  inhibits the throttling alerts (an alertname containing "throttl", such as GPUThrottled) on the same GPU.

An alert that inhibits is never inhibited itself, and a silenced cause still inhibits: silencing the cause
must not bring back the noise it explains. Only firing alerts are muted: a resolve closes what a receiver was
already told. Nothing about muting is stored on the alert; it is judged again at each read and each tick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from controlplane.notify.matchers import Matcher, parse_matcher

SilenceState = Literal["pending", "active", "expired"]
SILENCE_STATES: tuple[SilenceState, ...] = ("pending", "active", "expired")

# Policies' alerts are named pitstop-<policy> (``remediation.alerting.raise_alert``).
XID_HARDWARE = "pitstop-xid-hardware"
HOT_GPU = frozenset({"pitstop-thermal", "pitstop-thermal-sustained"})
THROTTLING = "throttl"  # GPUThrottled, ...Throttling: any alertname holding it, in any case

# Expired silences stay listed this long (Alertmanager keeps them 120 h), then only ``?state=expired`` shows them.
RECENT = timedelta(hours=120)
# A silence longer than this is a policy switched off: change the policy instead.
MAX_LENGTH = timedelta(days=366)
MAX_MATCHERS = 32


def silence_state(starts_at: datetime, ends_at: datetime, now: datetime) -> SilenceState:
    """Pending before ``starts_at``, active from it, expired from ``ends_at`` on (the end is not included).

    An empty window (a pending silence expired by hand: both ends moved to then) never applies: expired.
    """
    if now >= ends_at or ends_at <= starts_at:
        return "expired"
    if now < starts_at:
        return "pending"
    return "active"


def parse_matchers(texts: Sequence[str]) -> tuple[Matcher, ...]:
    """A silence's matchers from Alertmanager's syntax (``name="value"``, ``name=~"regex"``...).

    Raises ValueError naming every bad matcher; and when the matchers together match any alert at all (each
    also matches an alert without that label), since such a silence would mute the whole fleet.
    """
    if not texts:
        raise ValueError("a silence needs at least one matcher, e.g. alertname=\"pitstop-stall\"")
    if len(texts) > MAX_MATCHERS:
        raise ValueError(f"at most {MAX_MATCHERS} matchers")
    problems: list[str] = []
    matchers: list[Matcher] = []
    for text in texts:
        try:
            matchers.append(Matcher.model_validate(parse_matcher(text)))
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))
    if all(m.matches({}) for m in matchers):
        shown = ", ".join(str(m) for m in matchers)
        raise ValueError(f"matchers {shown} match every alert: at least one must need a label value, "
                         "e.g. alertname=\"pitstop-stall\"")
    return tuple(matchers)


@dataclass(frozen=True)
class Silence:
    id: int
    matchers: tuple[Matcher, ...]
    starts_at: datetime
    ends_at: datetime

    def state(self, now: datetime) -> SilenceState:
        return silence_state(self.starts_at, self.ends_at, now)

    def silences(self, labels: Mapping[str, str], now: datetime) -> bool:
        """Active now and every matcher matches (a silence without matchers matches nothing)."""
        return (self.state(now) == "active" and bool(self.matchers)
                and all(m.matches(labels) for m in self.matchers))


@dataclass(frozen=True)
class AlertFacts:
    """A firing alert as the rules see it: its id and labels."""

    id: int
    labels: Mapping[str, str]


@dataclass(frozen=True)
class NodeFacts:
    name: str
    cordoned: bool = False
    # Stale: no report for the server's ``stale_after_seconds``.
    unreachable: bool = False
    last_report_at: datetime | None = None


@dataclass(frozen=True)
class Muting:
    """Why an alert is muted: the silences that match it, and what inhibits it (alert ids, or a reason)."""

    silenced_by: tuple[int, ...] = ()
    inhibited_by: tuple[int | str, ...] = ()

    @property
    def muted(self) -> bool:
        return bool(self.silenced_by or self.inhibited_by)


def node_of(labels: Mapping[str, str]) -> str | None:
    """The alert's ``node`` label, else the node of its ``replica:node/name`` target."""
    node = labels.get("node")
    if node:
        return node
    target = labels.get("target", "")
    if target.startswith("replica:") and "/" in target:
        return target.removeprefix("replica:").split("/", 1)[0] or None
    return None


def gpu_of(labels: Mapping[str, str]) -> str | None:
    """The GPU an alert is about, as ``gpu:node/index``: its target, else its ``node`` and ``gpu`` labels."""
    target = labels.get("target", "")
    if target.startswith("gpu:"):
        return target
    node, gpu = labels.get("node"), labels.get("gpu") or labels.get("index")
    return f"gpu:{node}/{gpu}" if node and gpu else None


def on_replica(labels: Mapping[str, str]) -> bool:
    """An alert about a replica (a stall, a crash loop, an SLO breach), not about its node or GPUs."""
    return bool(labels.get("replica")) or labels.get("target", "").startswith("replica:")


def throttling(labels: Mapping[str, str]) -> bool:
    return THROTTLING in labels.get("alertname", "").lower()


def _is_cause(labels: Mapping[str, str]) -> bool:
    name = labels.get("alertname", "")
    return name == XID_HARDWARE or name in HOT_GPU


def node_reasons(node: NodeFacts | None) -> list[str]:
    """Why the node's replica alerts are inhibited by the node's own state."""
    if node is None:
        return []
    reasons = []
    if node.cordoned:
        reasons.append(f"node {node.name} is cordoned")
    if node.unreachable:
        since = "" if node.last_report_at is None else f": no report since {node.last_report_at.isoformat()}"
        reasons.append(f"node {node.name} is unreachable{since}")
    return reasons


def inhibitions(firing: Sequence[AlertFacts], nodes: Mapping[str, NodeFacts]) -> dict[int, tuple[int | str, ...]]:
    """What inhibits each firing alert that is inhibited: the causing alerts' ids (ascending), then reasons."""
    xid_by_node: dict[str, list[int]] = {}
    hot_by_gpu: dict[str, list[int]] = {}
    for alert in firing:
        name = alert.labels.get("alertname", "")
        node, gpu = node_of(alert.labels), gpu_of(alert.labels)
        if name == XID_HARDWARE and node:
            xid_by_node.setdefault(node, []).append(alert.id)
        if name in HOT_GPU and gpu:
            hot_by_gpu.setdefault(gpu, []).append(alert.id)
    out: dict[int, tuple[int | str, ...]] = {}
    for alert in firing:
        if _is_cause(alert.labels):
            continue  # an inhibiting alert is never inhibited
        ids: set[int] = set()
        reasons: list[str] = []
        node = node_of(alert.labels)
        if on_replica(alert.labels) and node:
            ids.update(xid_by_node.get(node, []))
            reasons += node_reasons(nodes.get(node))
        gpu = gpu_of(alert.labels)
        if throttling(alert.labels) and gpu:
            ids.update(hot_by_gpu.get(gpu, []))
        ids.discard(alert.id)
        if ids or reasons:
            out[alert.id] = (*sorted(ids), *reasons)
    return out


def mutes(firing: Sequence[AlertFacts], silences: Sequence[Silence], nodes: Mapping[str, NodeFacts],
          now: datetime) -> dict[int, Muting]:
    """Each muted alert among ``firing`` (the firing alerts, all of them: any may inhibit another) and why."""
    inhibited = inhibitions(firing, nodes)
    out: dict[int, Muting] = {}
    for alert in firing:
        muting = Muting(silenced_by=tuple(s.id for s in silences if s.silences(alert.labels, now)),
                        inhibited_by=inhibited.get(alert.id, ()))
        if muting.muted:
            out[alert.id] = muting
    return out
