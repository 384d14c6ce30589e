"""A dark node: no report for the condition's ``for:``, and what that leaves unaccounted for, model by model.

The finding is the page's whole story: the node, when it was last heard, the replicas and models it runs, and,
per model, how many of its replicas are on nodes that went dark (this one and any other) out of how many it
has. The control plane's clock decides, never the agent's: a node whose clock is wrong still pages on time.

A model left with fewer READY replicas on reporting nodes than its disruption budget (the guardrails' floor,
``FleetSnapshot.ready_floors``) because some of its replicas are on dark nodes is a finding of its own, on the
model: one page per model, however many of its nodes went dark.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from controlplane.policy.conditions import NodeUnreachableCondition
from controlplane.policy.detectors.findings import Evidence, Finding
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import FleetSnapshot, Node, Replica


def silent_since(node: Node, snapshot: FleetSnapshot) -> datetime | None:
    """From when the node's silence counts: its last report, or this control plane's start if that is later
    (None: the node never reported)."""
    if node.last_report_at is None:
        return None
    since = snapshot.reports_since
    return node.last_report_at if since is None else max(node.last_report_at, since)


def dark(cond: NodeUnreachableCondition, node: Node, snapshot: FleetSnapshot, now: datetime) -> bool:
    start = silent_since(node, snapshot)
    return start is not None and now - start >= timedelta(seconds=cond.for_)


def detect_node_unreachable(cond: NodeUnreachableCondition, node: Node, snapshot: FleetSnapshot, now: datetime,
                            dark_nodes: set[str]) -> Finding | None:
    """A finding when ``node`` has been silent for the condition's ``for:``; ``dark_nodes``: every node silent as
    long (for the models' share of replicas gone dark, which may span nodes)."""
    if not dark(cond, node, snapshot, now) or node.last_report_at is None:
        return None
    silent = (now - node.last_report_at).total_seconds()
    mine = snapshot.replicas_on(node.name)
    models = sorted({r.model for r in mine})
    parts = [_model_share(model, mine, snapshot.replicas_of_model(model), dark_nodes) for model in models]
    runs = "; runs " + ", ".join(parts) if parts else "; runs no replica"
    heard = node.last_report_at.isoformat(timespec="seconds")
    dark_replicas = sum(1 for r in snapshot.replicas if r.node in dark_nodes and r.model in models)
    return Finding(
        detector="node_unreachable",
        subject=node.name,
        summary=f"node {node.name} unreachable: no report for {format_duration(round(silent))} (last {heard})"
        + runs,
        measured={"silent_seconds": round(silent, 1), "replicas": len(mine), "models": len(models),
                  "replicas_unaccounted": dark_replicas,
                  "replicas_of_its_models": sum(len(snapshot.replicas_of_model(m)) for m in models)},
        evidence=[Evidence(at=node.last_report_at, values={
            "last_report_at": heard, "replicas": [r.name for r in mine], "models": models})],
    )


def _model_share(model: str, mine: Sequence[Replica], of_model: Sequence[Replica], dark_nodes: set[str]) -> str:
    here = sorted(r.name for r in mine if r.model == model)
    gone = sum(1 for r in of_model if r.node in dark_nodes)
    return f"{model}: {', '.join(here)} here, {gone} of its {len(of_model)} replicas unaccounted for"


def node_unreachable_due(cond: NodeUnreachableCondition, node: Node, snapshot: FleetSnapshot,
                         now: datetime) -> datetime | None:
    """When the node counts as dark if it stays silent: its silence's start plus ``for:`` (None once it does)."""
    start = silent_since(node, snapshot)
    if start is None:
        return None
    due = start + timedelta(seconds=cond.for_)
    return due if due > now else None


def detect_model_short(cond: NodeUnreachableCondition, model: str, snapshot: FleetSnapshot,
                       dark_nodes: set[str]) -> Finding | None:
    """A finding on ``model`` when replicas on ``dark_nodes`` leave it below its READY floor."""
    floor = snapshot.ready_floors.get(model)
    members = snapshot.replicas_of_model(model)
    lost = [r for r in members if r.node in dark_nodes]
    if floor is None or not lost:
        return None
    ready = [r for r in members if r.node not in dark_nodes and r.ready]
    if len(ready) >= floor:
        return None
    where: dict[str, list[str]] = {}
    for r in lost:
        where.setdefault(r.node, []).append(r.name)
    on = "; ".join(f"{node}: {', '.join(sorted(names))}" for node, names in sorted(where.items()))
    return Finding(
        detector="node_unreachable",
        subject=f"model:{model}",
        summary=f"model {model} below its disruption budget: {len(ready)} of {len(members)} replicas READY on "
        f"nodes that report, budget needs {floor}; {len(lost)} on silent nodes ({on})",
        measured={"ready": len(ready), "replicas": len(members), "floor": floor, "on_silent_nodes": len(lost)},
        evidence=[Evidence(at=snapshot.now, values={"silent_nodes": sorted(where), "ready": [r.key for r in ready]})],
    )
