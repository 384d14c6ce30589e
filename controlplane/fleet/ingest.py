"""Apply one agent report to the store: upsert node, GPUs and replicas, append events and samples.

Service functions are keyword-only and take the session; the caller owns the transaction, so a report is
written whole or not at all. A report is the node's full picture: GPUs and replicas it no longer lists are
removed (their events and samples stay).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from agent.wire import DesiredState, GpuSample, NodeReport, ReplicaSpec, ReplicaStatus
from controlplane.fleet.sequencing import Verdict, classify
from controlplane.store.models import DesiredReplica, Gpu, Node, Replica, ReplicaEventRow, Sample

# The numeric fields kept as time series; everything else is only kept as the latest reading.
REPLICA_SERIES = (
    ("engine", "ttft_p99_seconds"),
    ("engine", "itl_p99_seconds"),
    ("engine", "e2e_p99_seconds"),
    ("engine", "requests_running"),
    ("engine", "requests_waiting"),
    ("engine", "kv_cache_usage_ratio"),
    ("engine", "generation_tokens_per_second"),
    ("engine", "requests_per_second"),
    ("engine", "errors_per_second"),
    ("process", "rss_bytes"),
    ("process", "gpu_memory_bytes"),
    ("process", "cpu_percent"),
)
GPU_SERIES = ("temperature_celsius", "memory_used_bytes", "utilization_ratio", "power_watts")


def replica_series_values(status: ReplicaStatus) -> dict[str, float]:
    """The numeric readings of one replica worth charting; fields the agent could not read are left out."""
    values: dict[str, float] = {}
    for part, field in REPLICA_SERIES:
        sample = getattr(status, part)
        value = None if sample is None else getattr(sample, field)
        if value is not None:
            values[field] = float(value)
    if status.canary_ttft_seconds is not None:
        values["canary_ttft_seconds"] = status.canary_ttft_seconds
    return values


def gpu_series_values(gpu: GpuSample) -> dict[str, float]:
    values: dict[str, float] = {}
    for field in GPU_SERIES:
        value = getattr(gpu, field)
        if value is not None:
            values[field] = float(value)
    return values


def _upsert_node(session: Session, report: NodeReport, now: datetime) -> None:
    node = session.get(Node, report.node)
    if node is None:
        node = Node(name=report.node, first_seen_at=now, reports_total=0, cordoned=False)
        session.add(node)
    node.hostname = report.hostname
    node.agent_version = report.agent_version
    node.agent_url = report.agent_url
    node.last_report_at = now
    node.last_sent_at = report.sent_at
    node.last_sequence = report.sequence
    node.reports_total = (node.reports_total or 0) + 1
    node.status = "up"


def _replace_gpus(session: Session, report: NodeReport, now: datetime) -> None:
    session.execute(delete(Gpu).where(Gpu.node == report.node))
    for gpu in report.gpus:
        session.add(Gpu(node=report.node, index=gpu.index, uuid=gpu.uuid, name=gpu.name, updated_at=now,
                        readings=gpu.model_dump(mode="json")))
        values = gpu_series_values(gpu)
        if values:
            session.add(Sample(node=report.node, subject_kind="gpu", subject=str(gpu.index), at=report.sent_at,
                               resolution_seconds=0, values=values))


def _dump(model: Any) -> dict[str, Any] | None:
    return None if model is None else dict(model.model_dump(mode="json"))


def _replace_replicas(session: Session, report: NodeReport, now: datetime) -> None:
    session.execute(delete(Replica).where(Replica.node == report.node))
    for r in report.replicas:
        session.add(Replica(
            node=report.node, name=r.name, model=r.model, url=r.url, managed=r.managed, state=r.state.value,
            ready=r.ready, generation=r.generation, gpus=list(r.gpus), engine_args=list(r.engine_args),
            restarts_total=r.restarts_total, state_since=r.state_since, last_exit_code=r.last_exit_code,
            log_tail=list(r.log_tail), engine=_dump(r.engine), process=_dump(r.process),
            canary_ttft_seconds=r.canary_ttft_seconds, canary_ok=r.canary_ok, updated_at=now,
        ))
        values = replica_series_values(r)
        if values:
            session.add(Sample(node=report.node, subject_kind="replica", subject=r.name, at=report.sent_at,
                               resolution_seconds=0, values=values))


def _append_events(session: Session, report: NodeReport, now: datetime) -> None:
    for e in report.events:
        session.add(ReplicaEventRow(
            node=report.node, replica=e.replica, at=e.at, received_at=now, kind=e.kind,
            from_state=None if e.from_state is None else e.from_state.value,
            to_state=None if e.to_state is None else e.to_state.value, message=e.message,
        ))


def apply_report(*, session: Session, report: NodeReport, now: datetime) -> Verdict:
    """Store ``report`` if it is news (see ``sequencing``); return what was decided."""
    node = session.get(Node, report.node)
    verdict = classify(
        last_sequence=None if node is None else node.last_sequence,
        last_sent_at=None if node is None else node.last_sent_at,
        sequence=report.sequence,
        sent_at=report.sent_at,
    )
    if not verdict.applies:
        return verdict
    _upsert_node(session, report, now)
    session.flush()  # the node row must exist before GPU and replica rows point at it
    _replace_gpus(session, report, now)
    _replace_replicas(session, report, now)
    _append_events(session, report, now)
    return verdict


def desired_state(*, session: Session, node: str, report_interval_seconds: float | None = None) -> DesiredState:
    """The answer to ``node``'s report: its replica specs from the desired-state table (empty when none)."""
    rows = session.scalars(
        select(DesiredReplica).where(DesiredReplica.node == node).order_by(DesiredReplica.name)
    ).all()
    stored = session.get(Node, node)
    return DesiredState(
        node=node,
        cordoned=bool(stored and stored.cordoned),
        replicas=[ReplicaSpec(name=r.name, generation=r.generation, engine_args=list(r.engine_args),
                              enabled=r.enabled) for r in rows],
        report_interval_seconds=report_interval_seconds,
    )
