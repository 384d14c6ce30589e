"""Apply one agent report to the store: upsert node, GPUs and replicas, append events and samples.

Service functions are keyword-only and take the session; the caller owns the transaction, so a report is
written whole or not at all. A report is the node's full picture: GPUs and replicas it no longer lists are
removed (their events and samples stay).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, delete, insert, select, update
from sqlalchemy.orm import Session

from agent.wire import DesiredState, GpuSample, NodeReport, ReplicaSpec, ReplicaStatus
from controlplane.fleet.sequencing import Verdict, classify
from controlplane.policy.engine_args import get_int_flag
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
    ("engine", "generation_tokens_total"),
    ("engine", "preemptions_total"),
    ("process", "rss_bytes"),
    ("process", "gpu_memory_bytes"),
    ("process", "cpu_percent"),
)
GPU_SERIES = ("temperature_celsius", "memory_used_bytes", "utilization_ratio", "power_watts", "xid_events_total")


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
    # The policy engine's stall detector reads the canary, the governor the max-num-seqs each sample ran with.
    if status.canary_ok is not None:
        values["canary_ok"] = 1.0 if status.canary_ok else 0.0
    max_num_seqs = get_int_flag(status.engine_args, "--max-num-seqs")
    if max_num_seqs is not None:
        values["max_num_seqs"] = float(max_num_seqs)
    return values


def gpu_series_values(gpu: GpuSample) -> dict[str, float]:
    values: dict[str, float] = {}
    for field in GPU_SERIES:
        value = getattr(gpu, field)
        if value is not None:
            values[field] = float(value)
    return values


def _node_values(report: NodeReport, now: datetime) -> dict[str, Any]:
    return {"hostname": report.hostname, "agent_version": report.agent_version, "agent_url": report.agent_url,
            "memory_total_bytes": report.memory_total_bytes,
            "last_report_at": now, "last_sent_at": report.sent_at, "last_sequence": report.sequence,
            "status": "up"}


def _dump(model: Any) -> dict[str, Any] | None:
    return None if model is None else dict(model.model_dump(mode="json"))


def _gpu_rows(report: NodeReport, now: datetime) -> list[dict[str, Any]]:
    return [{"node": report.node, "index": g.index, "uuid": g.uuid, "name": g.name, "updated_at": now,
             "readings": g.model_dump(mode="json")} for g in report.gpus]


def _replica_rows(report: NodeReport, now: datetime) -> list[dict[str, Any]]:
    return [{
        "node": report.node, "name": r.name, "model": r.model, "url": r.url, "managed": r.managed,
        "state": r.state.value, "ready": r.ready, "generation": r.generation, "gpus": list(r.gpus),
        "engine_args": list(r.engine_args), "restarts_total": r.restarts_total, "state_since": r.state_since,
        "last_exit_code": r.last_exit_code, "log_tail": list(r.log_tail), "engine": _dump(r.engine),
        "process": _dump(r.process), "canary_ttft_seconds": r.canary_ttft_seconds, "canary_ok": r.canary_ok,
        "updated_at": now,
    } for r in report.replicas]


def _sample_rows(report: NodeReport) -> list[dict[str, Any]]:
    rows = []
    for g in report.gpus:
        if values := gpu_series_values(g):
            rows.append({"node": report.node, "subject_kind": "gpu", "subject": str(g.index),
                         "at": report.sent_at, "resolution_seconds": 0, "values": values})
    for r in report.replicas:
        if values := replica_series_values(r):
            rows.append({"node": report.node, "subject_kind": "replica", "subject": r.name,
                         "at": report.sent_at, "resolution_seconds": 0, "values": values})
    return rows


def _event_rows(report: NodeReport, now: datetime) -> list[dict[str, Any]]:
    return [{"node": report.node, "replica": e.replica, "at": e.at, "received_at": now, "kind": e.kind,
             "from_state": None if e.from_state is None else e.from_state.value,
             "to_state": None if e.to_state is None else e.to_state.value, "message": e.message}
            for e in report.events]


def _table(model: type[Any]) -> Table:
    table: Table = model.__table__
    return table


_NODES, _GPUS, _REPLICAS = _table(Node), _table(Gpu), _table(Replica)
_SAMPLES, _EVENTS, _DESIRED = _table(Sample), _table(ReplicaEventRow), _table(DesiredReplica)
# Built once: SQLAlchemy memoises a statement's cache key on the object, so reusing these skips the per-call
# key generation that showed in profiles at 200 reports a second.
_NODE_LAST = select(_NODES.c.last_sequence, _NODES.c.last_sent_at).where(_NODES.c.name == bindparam("b_node"))
_NODE_INSERT = insert(_NODES)
_NODE_UPDATE = (update(_NODES).where(_NODES.c.name == bindparam("b_node"))
                .values(reports_total=_NODES.c.reports_total + 1))
_DELETE_GPUS = delete(_GPUS).where(_GPUS.c.node == bindparam("b_node"))
_DELETE_REPLICAS = delete(_REPLICAS).where(_REPLICAS.c.node == bindparam("b_node"))
_INSERTS = {"gpus": insert(_GPUS), "replicas": insert(_REPLICAS), "samples": insert(_SAMPLES),
            "events": insert(_EVENTS)}
_DESIRED_OF = (select(_DESIRED.c.name, _DESIRED.c.generation, _DESIRED.c.engine_args, _DESIRED.c.enabled,
                      _DESIRED.c.capture_stack_generation)
               .where(_DESIRED.c.node == bindparam("b_node")).order_by(_DESIRED.c.name))
_CORDONED = select(_NODES.c.cordoned, _NODES.c.cordoned_gpus).where(_NODES.c.name == bindparam("b_node"))


def apply_report(*, session: Session, report: NodeReport, now: datetime) -> Verdict:
    """Store ``report`` if it is news (see ``sequencing``); return what was decided.

    Written with Core statements on the session's connection, one multi-row INSERT per table: at 200
    reports a second the ORM's per-object unit of work cost more than the database did.
    """
    conn = session.connection()
    key = {"b_node": report.node}
    found = conn.execute(_NODE_LAST, key).first()
    verdict = classify(
        last_sequence=None if found is None else found.last_sequence,
        last_sent_at=None if found is None else found.last_sent_at,
        sequence=report.sequence,
        sent_at=report.sent_at,
    )
    if not verdict.applies:
        return verdict
    values = _node_values(report, now)
    if found is None:
        conn.execute(_NODE_INSERT, {"name": report.node, "first_seen_at": now, "reports_total": 1,
                                    "cordoned": False, **values})
    else:
        conn.execute(_NODE_UPDATE, {**key, **values})
    # The report is the node's full picture: replace its latest GPU and replica rows wholesale.
    conn.execute(_DELETE_GPUS, key)
    conn.execute(_DELETE_REPLICAS, key)
    for table, rows in (("gpus", _gpu_rows(report, now)), ("replicas", _replica_rows(report, now)),
                        ("samples", _sample_rows(report)), ("events", _event_rows(report, now))):
        if rows:
            conn.execute(_INSERTS[table], rows)
    return verdict


def desired_state(*, session: Session, node: str, report_interval_seconds: float | None = None) -> DesiredState:
    """The answer to ``node``'s report: its replica specs from the desired-state table (empty when none)."""
    conn = session.connection()
    rows = conn.execute(_DESIRED_OF, {"b_node": node}).all()
    fence = conn.execute(_CORDONED, {"b_node": node}).first()
    return answer(node, fence, [replica_spec(r) for r in rows], report_interval_seconds)


def replica_spec(row: Any) -> ReplicaSpec:
    """One desired-replica row as the agent reads it; a stack dump is asked for the generation it was set for."""
    return ReplicaSpec(name=row.name, generation=row.generation, engine_args=list(row.engine_args),
                       enabled=row.enabled, capture_stack=row.capture_stack_generation == row.generation)


def answer(node: str, fence: Any, specs: list[ReplicaSpec], report_interval_seconds: float | None) -> DesiredState:
    """The desired state of ``node`` from its specs and its node row's cordons (``fence``; None: unknown node)."""
    return DesiredState(
        node=node,
        cordoned=bool(fence is not None and fence.cordoned),
        cordoned_gpus=sorted(fence.cordoned_gpus or []) if fence is not None else [],
        replicas=specs,
        report_interval_seconds=report_interval_seconds,
    )
