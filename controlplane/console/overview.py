"""The Fleet page as data: ``GET /v1/summary`` (and the firing alerts) → what on-call reads first. Pure.

Per model: its SLO status (TTFT p99, ITL p99, error ratio) against the policies' targets, replicas by state,
throughput and the alerts firing on it; then whether automation runs and what it last did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.console.palette import STATUS_DOT, badge, state_badge
from controlplane.console.shaping import Json

OBJECTIVE_LABELS = {"ttft_p99": "TTFT p99", "itl_p99": "ITL p99", "error_ratio": "error ratio"}


def objective_text(objective: Json) -> str:
    """``value / target`` in the unit on-call reads: milliseconds for latency, percent for errors."""
    name, value, target = objective.get("name"), objective.get("value"), objective.get("target")

    def fmt(x: Any) -> str:
        if x is None:
            return "-"
        return f"{float(x) * 100:.2g}%" if name == "error_ratio" else f"{float(x) * 1000:.0f} ms"

    text = f"{OBJECTIVE_LABELS.get(str(name), name)} {fmt(value)}"
    return text + (f" / {fmt(target)}" if target is not None else " (no target)")


def firing_by_model(alerts: Sequence[Json]) -> dict[str, list[Json]]:
    """Firing alerts per model label; those on no model (a node, the fleet) under ""."""
    out: dict[str, list[Json]] = {}
    for a in alerts:
        if a.get("state") == "firing":
            out.setdefault(str((a.get("labels") or {}).get("model") or ""), []).append(a)
    return out


def model_cards(summary: Json, alerts: Sequence[Json]) -> list[dict[str, Any]]:
    """One card per model, the worst status first: status, objectives, states, tokens/s, firing alerts."""
    firing = firing_by_model(alerts)
    rank = {"red": 0, "amber": 1, "unknown": 2, "green": 3}
    cards = []
    for m in sorted(summary.get("models") or [], key=lambda m: (rank.get(m.get("status"), 2), m.get("model"))):
        tps = m.get("tokens_per_second")
        cards.append({
            "model": m["model"], "status": m.get("status", "unknown"),
            "headline": f"{STATUS_DOT.get(m.get('status', 'unknown'), STATUS_DOT['unknown'])} **{m['model']}** · "
                        f"{m.get('ready', 0)} of {m.get('replicas', 0)} serving",
            "objectives": " ".join(badge(o.get("status", "unknown"), objective_text(o))
                                   for o in m.get("objectives") or []),
            "states": " ".join(state_badge(s, n) for s, n in (m.get("by_state") or {}).items()),
            "throughput": "-" if tps is None else f"{tps:,.0f} tokens/s",
            "alerts": [f"{a.get('severity')}: {(a.get('labels') or {}).get('alertname')} on "
                       f"{(a.get('labels') or {}).get('target')}"
                       + (" (silenced)" if a.get("silenced_by") else "")
                       for a in firing.get(str(m["model"]), [])],
        })
    return cards


def automation_lines(summary: Json) -> list[tuple[str, str]]:
    """(level, line) about automation: ``error`` for a tripped breaker, ``warning`` when off, else ``info``."""
    auto: Json = summary.get("automation") or {}
    breaker: Json = auto.get("breaker") or {}
    lines: list[tuple[str, str]] = []
    if breaker.get("tripped"):
        lines.append(("error", f"Circuit breaker TRIPPED at {breaker.get('tripped_at')}: {breaker.get('reason')}. "
                               "Disruptive automation is stopped until an operator resets it."))
    if not auto.get("policies_enabled", True):
        lines.append(("warning", "Automation is off (policies_enabled: false): Pitstop watches and acts on nothing."))
    mode = f"{auto.get('policies', 0)} policies loaded"
    if auto.get("dry_run"):
        mode += f"; dry run: {', '.join(auto['dry_run'])}"
    if auto.get("approval"):
        mode += f"; waiting for approval: {', '.join(auto['approval'])}"
    if not breaker.get("tripped") and auto.get("policies_enabled", True):
        mode = "Automation running, circuit breaker closed. " + mode
    lines.append(("info", mode))
    return lines


def node_line(summary: Json) -> str:
    n: Json = summary.get("nodes") or {}
    return (f"{n.get('total', 0)} nodes: {n.get('up', 0)} up, {n.get('stale', 0)} not reporting, "
            f"{n.get('cordoned', 0)} cordoned · {summary.get('alerts_firing', 0)} alerts firing")


def recent_rows(summary: Json) -> list[dict[str, Any]]:
    """The last actions: what, on what, by whom, and how it ended (or where it is)."""
    return [{"id": a["id"], "created": a.get("created_at"), "kind": a["kind"], "target": a["target"],
             "state": a["state"], "by": a.get("requested_by"), "outcome": a.get("outcome") or ""}
            for a in summary.get("recent_actions") or []]
