"""``build_snapshot``: the policy engine's ``FleetSnapshot`` read from the store in a few bulk queries.

Latest state comes from the nodes, gpus and replicas tables; histories from the samples table over
``history`` (one query per subject kind, grouped in Python: per-replica queries would be 8,000 round trips).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.wire import ReplicaState
from controlplane.policy.snapshot import FleetSnapshot, Gpu, GpuReading, Node, Replica, ReplicaSample
from controlplane.store.models import Gpu as GpuRow
from controlplane.store.models import Node as NodeRow
from controlplane.store.models import Replica as ReplicaRow
from controlplane.store.models import Sample

_REPLICA_FIELDS = frozenset(ReplicaSample.model_fields) - {"at", "canary_ok", "max_num_seqs", "rss_bytes",
                                                            "gpu_memory_bytes"}
_INT_FIELDS = ("rss_bytes", "gpu_memory_bytes", "max_num_seqs")
Point = tuple[datetime, dict[str, Any]]


def replica_sample(at: datetime, values: dict[str, Any]) -> ReplicaSample:
    """A stored sample's values as the engine's ``ReplicaSample`` (booleans were stored as 0/1 averages)."""
    fields: dict[str, Any] = {k: v for k, v in values.items() if k in _REPLICA_FIELDS}
    for name in _INT_FIELDS:
        if values.get(name) is not None:
            fields[name] = int(values[name])
    if values.get("canary_ok") is not None:
        fields["canary_ok"] = float(values["canary_ok"]) >= 0.5
    # Stored values were validated on the way in: construct without validating again (8,000 replicas times
    # their histories made validation the larger part of a policy pass).
    return ReplicaSample.model_construct(at=at, **fields)


def gpu_reading(at: datetime, values: dict[str, Any]) -> GpuReading:
    return GpuReading.model_construct(
        at=at, temperature_celsius=values.get("temperature_celsius"),
        memory_used_bytes=None if values.get("memory_used_bytes") is None else int(values["memory_used_bytes"]),
        xid_events_total=None if values.get("xid_events_total") is None else int(values["xid_events_total"]),
        throttle_reasons=[],
    )


def _histories(session: Session, kind: str, since: datetime,
               models: set[tuple[str, str]] | None) -> dict[tuple[str, str], list[Point]]:
    out: dict[tuple[str, str], list[Point]] = defaultdict(list)
    query = (select(Sample.node, Sample.subject, Sample.at, Sample.values)
             .where(Sample.subject_kind == kind, Sample.at >= since).order_by(Sample.at))
    for node, subject, at, values in session.execute(query):
        key = (node, subject)
        if models is None or key in models:
            out[key].append((at, values))
    return out


def build_snapshot(*, session: Session, now: datetime, history: timedelta = timedelta(minutes=15),
                   model: str | None = None) -> FleetSnapshot:
    """The fleet at ``now`` with ``history`` of samples; ``model`` limits replicas to one model (no GPUs then)."""
    since = now - history
    nodes = [Node(name=n.name, cordoned=n.cordoned, memory_total_bytes=n.memory_total_bytes,
                  last_report_at=n.last_report_at)
             for n in session.scalars(select(NodeRow).order_by(NodeRow.name))]
    replica_query = select(ReplicaRow).order_by(ReplicaRow.node, ReplicaRow.name)
    if model is not None:
        replica_query = replica_query.where(ReplicaRow.model == model)
    rows = list(session.scalars(replica_query))
    wanted = {(r.node, r.name) for r in rows} if model is not None else None
    replica_history = _histories(session, "replica", since, wanted) if history > timedelta(0) else {}
    replicas = [Replica.model_construct(
        node=r.node, labels={}, name=r.name, model=r.model, gpus=list(r.gpus), state=ReplicaState(r.state),
        ready=r.ready,
        managed=r.managed, state_since=r.state_since, engine_args=list(r.engine_args), generation=r.generation,
        restarts_total=r.restarts_total, last_exit_code=r.last_exit_code, log_tail=list(r.log_tail),
        history=[replica_sample(at, v) for at, v in replica_history.get((r.node, r.name), [])],
    ) for r in rows]
    gpus: list[Gpu] = []
    if model is None:
        gpu_history = _histories(session, "gpu", since, None) if history > timedelta(0) else {}
        for g in session.scalars(select(GpuRow).order_by(GpuRow.node, GpuRow.index)):
            readings = g.readings
            gpus.append(Gpu.model_construct(
                node=g.node, index=g.index, uuid=g.uuid, name=g.name,
                slowdown_temperature_celsius=readings.get("slowdown_temperature_celsius"),
                memory_used_bytes=readings.get("memory_used_bytes"),
                memory_total_bytes=readings.get("memory_total_bytes"),
                throttle_reasons=list(readings.get("throttle_reasons") or []),
                xid_events_total=int(readings.get("xid_events_total") or 0), last_xid=readings.get("last_xid"),
                history=[gpu_reading(at, v) for at, v in gpu_history.get((g.node, str(g.index)), [])],
            ))
    return FleetSnapshot(now=now, nodes=nodes, gpus=gpus, replicas=replicas)
