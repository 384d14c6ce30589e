"""Read the fleet for the API: rows in, response models out, with staleness judged against ``now``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, func, select
from sqlalchemy.orm import Session

from agent.wire import EngineSample, LiveLimits, ProcessSample, bounded, salvage
from controlplane.fleet.schemas import (
    EventOut,
    GpuOut,
    NodeDetail,
    NodeOut,
    NodeStatus,
    ReplicaOut,
    ReplicaSampleOut,
    ReplicaValues,
    SampleOut,
)
from controlplane.fleet.summary import FIGURES, ReplicaFigures
from controlplane.store.models import Gpu, Node, Replica, ReplicaEventRow
from controlplane.store.samples import subject_series


def node_status(*, last_report_at: datetime, now: datetime, stale_after: timedelta) -> NodeStatus:
    """``stale`` once the last report is older than ``stale_after`` (judged on the control plane's clock)."""
    return NodeStatus.STALE if now - last_report_at > stale_after else NodeStatus.UP


def _counts(session: Session, model: type[Gpu] | type[Replica]) -> dict[str, int]:
    rows = session.execute(select(model.node, func.count()).group_by(model.node)).all()
    return {str(node): int(count) for node, count in rows}


def _node_out(node: Node, *, now: datetime, stale_after: timedelta, gpus: int, replicas: int) -> NodeOut:
    return NodeOut(
        name=node.name, hostname=node.hostname, agent_version=node.agent_version, agent_url=node.agent_url,
        status=node_status(last_report_at=node.last_report_at, now=now, stale_after=stale_after),
        first_seen_at=node.first_seen_at, last_report_at=node.last_report_at,
        last_report_age_seconds=max(0.0, (now - node.last_report_at).total_seconds()),
        last_sequence=node.last_sequence, reports_total=node.reports_total, cordoned=node.cordoned,
        cordoned_gpus=sorted(node.cordoned_gpus or []), memory_total_bytes=node.memory_total_bytes,
        gpu_count=gpus, replica_count=replicas,
    )


def _statuses(session: Session, *, now: datetime, stale_after: timedelta) -> dict[str, NodeStatus]:
    rows = session.execute(select(Node.name, Node.last_report_at)).all()
    return {name: node_status(last_report_at=at, now=now, stale_after=stale_after) for name, at in rows}


def list_nodes(*, session: Session, now: datetime, stale_after: timedelta) -> list[NodeOut]:
    gpus, replicas = _counts(session, Gpu), _counts(session, Replica)
    nodes = session.scalars(select(Node).order_by(Node.name)).all()
    return [_node_out(n, now=now, stale_after=stale_after, gpus=gpus.get(n.name, 0),
                      replicas=replicas.get(n.name, 0)) for n in nodes]


# Read once: ``GpuOut.model_fields`` is a class property, a descriptor call on every read (15 per GPU here).
_GPU_FIELDS = frozenset(GpuOut.model_fields)


# A GPU's columns, not its ORM instance: at thousands of GPUs the instances cost more than the readings' JSON.
_GPU_COLUMNS = (Gpu.node, Gpu.index, Gpu.uuid, Gpu.name, Gpu.updated_at, Gpu.readings)


def _gpu_out(gpu: Row[str, int, str, str, datetime, dict[str, Any]], status: NodeStatus) -> GpuOut:
    readings = {k: v for k, v in gpu.readings.items() if k in _GPU_FIELDS}
    readings.update(node=gpu.node, node_status=status, index=gpu.index, uuid=gpu.uuid, name=gpu.name,
                    updated_at=gpu.updated_at)
    return GpuOut.model_validate(readings)


def _replica_out(r: Replica, status: NodeStatus) -> ReplicaOut:
    return ReplicaOut(
        node=r.node, node_status=status, name=r.name, model=r.model, url=r.url, managed=r.managed,
        state=r.state, ready=r.ready, generation=r.generation, gpus=list(r.gpus),
        engine_args=list(r.engine_args), restarts_total=r.restarts_total, state_since=r.state_since,
        last_exit_code=r.last_exit_code, log_tail=list(r.log_tail),
        # Salvaged: a reading stored before the wire bounded it (negative, infinite) reads as unknown, not a 500.
        engine=None if r.engine is None else salvage(EngineSample, r.engine),
        process=None if r.process is None else salvage(ProcessSample, r.process),
        canary_ttft_seconds=r.canary_ttft_seconds, canary_ok=r.canary_ok, updated_at=r.updated_at,
        live_limits=None if r.live_limits is None else salvage(LiveLimits, r.live_limits),
        engine_kind=r.engine_kind,
    )


def list_gpus(*, session: Session, now: datetime, stale_after: timedelta, node: str | None = None) -> list[GpuOut]:
    statuses = _statuses(session, now=now, stale_after=stale_after)
    query = select(*_GPU_COLUMNS).order_by(Gpu.node, Gpu.index)
    if node is not None:
        query = query.where(Gpu.node == node)
    return [_gpu_out(g, statuses.get(g.node, NodeStatus.STALE)) for g in session.execute(query)]


Match = str | Sequence[str] | None


def replica_filters(*, node: Match = None, model: Match = None, state: Match = None) -> list[ColumnElement[bool]]:
    """The WHERE clauses of a replica read: each filter given (one value or several) matches any of its values;
    states are the agent's upper-case names, matched whatever the case asked."""
    clauses = []
    for column, match in ((Replica.node, node), (Replica.model, model), (Replica.state, state)):
        values = [match] if isinstance(match, str) else list(match or ())
        if column is Replica.state:
            values = [v.upper() for v in values]
        if values:
            clauses.append(column == values[0] if len(values) == 1 else column.in_(values))
    return clauses


def list_replicas(
    *, session: Session, now: datetime, stale_after: timedelta,
    node: Match = None, model: Match = None, state: Match = None,
) -> list[ReplicaOut]:
    statuses = _statuses(session, now=now, stale_after=stale_after)
    query = (select(Replica).where(*replica_filters(node=node, model=model, state=state))
             .order_by(Replica.node, Replica.name))
    return [_replica_out(r, statuses.get(r.node, NodeStatus.STALE)) for r in session.scalars(query)]


def reading(sample: Mapping[str, Any], field: str) -> float | None:
    """``sample[field]`` as ``EngineSample``/``ProcessSample`` would keep it (a finite number, never negative; the
    wire's bound for every reading), else None: a reading stored before the wire bounded it is unknown, as
    ``salvage`` makes it, without validating the whole sample."""
    value = sample.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return bounded(float(value), 0.0, math.inf)


def replica_figures(*, session: Session, now: datetime, stale_after: timedelta) -> list[ReplicaFigures]:
    """Every replica's figures for the summary: five columns and one JSON column read, not the whole row (the
    log tail, flags and process sample would be decoded and validated for nothing)."""
    statuses = _statuses(session, now=now, stale_after=stale_after)
    rows = session.execute(select(Replica.node, Replica.model, Replica.state, Replica.ready, Replica.engine,
                                  Replica.engine_kind))
    out = []
    for node, model, state, ready, engine, kind in rows:
        status = statuses.get(node, NodeStatus.STALE)
        if not isinstance(engine, Mapping):
            out.append(ReplicaFigures(model, state, ready, status, has_engine=False, engine=kind))
            continue
        out.append(ReplicaFigures._make((model, state, ready, status, True, *(reading(engine, f) for f in FIGURES),
                                         kind)))
    return out


def get_replica(*, session: Session, now: datetime, stale_after: timedelta, node: str, name: str) -> ReplicaOut | None:
    row = session.get(Replica, (node, name))
    if row is None:
        return None
    return _replica_out(row, _statuses(session, now=now, stale_after=stale_after).get(node, NodeStatus.STALE))


def get_node(*, session: Session, now: datetime, stale_after: timedelta, name: str) -> NodeDetail | None:
    node = session.get(Node, name)
    if node is None:
        return None
    gpus = list_gpus(session=session, now=now, stale_after=stale_after, node=name)
    replicas = list_replicas(session=session, now=now, stale_after=stale_after, node=name)
    base = _node_out(node, now=now, stale_after=stale_after, gpus=len(gpus), replicas=len(replicas))
    return NodeDetail(**base.model_dump(), gpus=gpus, replicas=replicas)


def list_events(
    *, session: Session, limit: int, node: str | None = None, replica: str | None = None,
    since: datetime | None = None,
) -> list[EventOut]:
    """The most recent events first."""
    query = select(ReplicaEventRow).order_by(ReplicaEventRow.at.desc(), ReplicaEventRow.id.desc()).limit(limit)
    if node is not None:
        query = query.where(ReplicaEventRow.node == node)
    if replica is not None:
        query = query.where(ReplicaEventRow.replica == replica)
    if since is not None:
        query = query.where(ReplicaEventRow.at >= since)
    return [EventOut(id=e.id, node=e.node, replica=e.replica, at=e.at, received_at=e.received_at, kind=e.kind,
                     from_state=e.from_state, to_state=e.to_state, message=e.message)
            for e in session.scalars(query)]


def replica_samples(
    *, session: Session, node: str, name: str, since: datetime | None, limit: int,
) -> list[ReplicaSampleOut]:
    """A replica's time series, oldest first (the newest ``limit`` points when there are more). Salvaged: a value
    stored in a shape the table no longer reads is left out rather than failing the read."""
    points = subject_series(session, node=node, kind="replica", subject=name, since=since, newest=limit)
    return [ReplicaSampleOut(at=at, resolution_seconds=width, values=salvage(ReplicaValues, values))
            for at, width, values in points]


def gpu_samples(
    *, session: Session, node: str, index: int, since: datetime | None, limit: int,
) -> list[SampleOut] | None:
    """A GPU's time series as ``replica_samples`` gives a replica's; None when no node has that name. A known
    node's GPU that reported nothing (or no longer reports: its samples outlive its row) is an empty list."""
    if session.get(Node, node) is None:
        return None
    points = subject_series(session, node=node, kind="gpu", subject=str(index), since=since, newest=limit)
    return [SampleOut(at=at, resolution_seconds=width, values=values) for at, width, values in points]


def count_nodes_by_status(*, session: Session, now: datetime, stale_after: timedelta) -> dict[NodeStatus, int]:
    counts = dict.fromkeys(NodeStatus, 0)
    for status in _statuses(session, now=now, stale_after=stale_after).values():
        counts[status] += 1
    return counts
