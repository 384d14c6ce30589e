"""Apply agent reports to the store: upsert nodes, GPUs and replicas, append events and samples; answer each.

Service functions are keyword-only and take the session; the caller owns the transaction, so a batch of
reports is written whole or not at all (the report writer, ``writer.py``, batches them: group commit). A
report is its node's full picture: GPUs and replicas it no longer lists are removed (their events and samples
stay). On PostgreSQL a batch's statements are pipelined (one round trip) and its larger tables go through
COPY.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, Column, Connection, Table, bindparam, delete, insert, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from agent.wire import DesiredState, GpuSample, NodeReport, ReplicaSpec
from controlplane.fleet.sequencing import Verdict, classify
from controlplane.policy.signals import stored_values
from controlplane.store.models import DesiredReplica, Gpu, Node, NodeSamples, Replica, ReplicaEventRow, UtcDateTime
from controlplane.store.samples import node_row
from engines import DEFAULT_ENGINE

GPU_SERIES = ("temperature_celsius", "memory_used_bytes", "utilization_ratio", "power_watts", "xid_events_total",
              "ecc_uncorrected_total")


def gpu_series_values(gpu: GpuSample) -> dict[str, float | list[int] | list[str]]:
    """The GPU's numbers worth charting, plus the lists its detectors read, only when non-empty: the XID codes
    read since the previous report (the xid detector classifies each) and the active throttle reasons (the
    thermal detector's). Retention's one-minute averages keep only the numbers."""
    values: dict[str, float | list[int] | list[str]] = {}
    for field in GPU_SERIES:
        value = getattr(gpu, field)
        if value is not None:
            values[field] = float(value)
    if gpu.xids:
        values["xids"] = list(gpu.xids)
    if gpu.throttle_reasons:
        values["throttle_reasons"] = list(gpu.throttle_reasons)
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
        "live_limits": _dump(r.live_limits), "engine_kind": r.engine_kind or DEFAULT_ENGINE, "updated_at": now,
    } for r in report.replicas]


def _sample_rows(report: NodeReport) -> list[dict[str, Any]]:
    """The report's samples as one packed row of its node (``store.samples``), or none when it has no numbers."""
    row = node_row(report.node, report.sent_at, [
        *(("gpu", str(g.index), gpu_series_values(g)) for g in report.gpus),
        *(("replica", r.name, stored_values(r)) for r in report.replicas)])
    return [] if row is None else [row]


def _event_rows(report: NodeReport, now: datetime) -> list[dict[str, Any]]:
    return [{"node": report.node, "replica": e.replica, "at": e.at, "received_at": now, "kind": e.kind,
             "from_state": None if e.from_state is None else e.from_state.value,
             "to_state": None if e.to_state is None else e.to_state.value, "message": e.message}
            for e in report.events]


def _event_key(node: str, replica: str, at: datetime, kind: str, src: str | None,
               dst: str | None) -> tuple[Any, ...]:
    return node, replica, at.astimezone(UTC), kind, src, dst


def _unseen_events(conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` without the events already stored: an agent sends again what it cannot know was delivered (a
    report whose answer was lost, the undelivered events a killed agent left, ``agent.event_journal``), and a
    replica's event is stored once. Only reports carrying events pay for the look-up (events are rare)."""
    nodes = sorted({r["node"] for r in rows})
    since = min(r["at"] for r in rows)
    stored = {_event_key(*row) for row in conn.execute(
        select(_EVENTS.c.node, _EVENTS.c.replica, _EVENTS.c.at, _EVENTS.c.kind, _EVENTS.c.from_state,
               _EVENTS.c.to_state).where(_EVENTS.c.node.in_(nodes), _EVENTS.c.at >= since))}
    unseen = []
    for row in rows:
        key = _event_key(row["node"], row["replica"], row["at"], row["kind"], row["from_state"], row["to_state"])
        if key not in stored:
            stored.add(key)
            unseen.append(row)
    return unseen


def _table(model: type[Any]) -> Table:
    table: Table = model.__table__
    return table


_NODES, _GPUS, _REPLICAS = _table(Node), _table(Gpu), _table(Replica)
_SAMPLES, _EVENTS, _DESIRED = _table(NodeSamples), _table(ReplicaEventRow), _table(DesiredReplica)
# Built once: SQLAlchemy memoises a statement's cache key on the object, so reusing these skips the per-call
# key generation that showed in profiles at 200 reports a second.
_NODES_IN: BindParameter[Any] = bindparam("b_nodes", expanding=True)
# The fences (node and GPU cordons) are read with the sequence check: one round trip fewer for the answer.
_NODES_LAST = (select(_NODES.c.name, _NODES.c.last_sequence, _NODES.c.last_sent_at, _NODES.c.cordoned,
                      _NODES.c.cordoned_gpus).where(_NODES.c.name.in_(_NODES_IN)))
_NODE_INSERT = insert(_NODES)
_NODE_UPDATE = (update(_NODES).where(_NODES.c.name == bindparam("b_node"))
                .values(reports_total=_NODES.c.reports_total + 1))
_DELETE_GPUS = delete(_GPUS).where(_GPUS.c.node.in_(_NODES_IN))
_DELETE_REPLICAS = delete(_REPLICAS).where(_REPLICAS.c.node.in_(_NODES_IN))
# No RETURNING of generated keys: inside a pipeline no result is read until the end (a one-row INSERT would
# otherwise ask for its new id at once).
_INSERTS = {"gpus": insert(_GPUS).inline(), "replicas": insert(_REPLICAS).inline(),
            "samples": insert(_SAMPLES).inline(), "events": insert(_EVENTS).inline()}
_DESIRED_OF = (select(_DESIRED.c.node, _DESIRED.c.name, _DESIRED.c.generation, _DESIRED.c.engine_args,
                      _DESIRED.c.enabled, _DESIRED.c.capture_stack_generation, _DESIRED.c.live_cap)
               .where(_DESIRED.c.node.in_(_NODES_IN)).order_by(_DESIRED.c.node, _DESIRED.c.name))
_CORDONED = select(_NODES.c.name, _NODES.c.cordoned, _NODES.c.cordoned_gpus).where(_NODES.c.name.in_(_NODES_IN))
# Fewer rows go as one pipelined INSERT each (one round trip); COPY costs two but far less per row.
COPY_FROM_ROWS = 24
_PG = postgresql.dialect()


def apply_reports(*, session: Session, reports: Sequence[NodeReport], now: datetime,
                  fences: dict[str, Any] | None = None, max_clock_skew: timedelta | None = None) -> list[Verdict]:
    """Store each report that is news (see ``sequencing``); return the verdicts in the order of ``reports``.

    One transaction for the batch, with Core statements on the session's connection and one multi-row INSERT
    per table: the same rows and verdicts as the reports one at a time, for a fraction of the statements (at
    200 reports a second the ORM's per-object unit of work, then one transaction per report, cost more than
    the database did).

    The reports must come from distinct nodes (a batch holds a node's reports one at a time, in order).
    ``fences``, when given, receives each known node's row with its ``cordoned`` and ``cordoned_gpus`` (and its
    ``last_sequence`` and ``last_sent_at``, as they were before this batch). ``max_clock_skew``: a node's last
    ``sent_at`` later than ``now`` plus it is not trusted to tell a restart (``sequencing``).
    """
    nodes = [r.node for r in reports]
    if len(set(nodes)) != len(nodes):
        raise ValueError("a batch holds at most one report per node")
    if not reports:
        return []
    conn = session.connection()
    found = {row.name: row for row in conn.execute(_NODES_LAST, {"b_nodes": nodes})}
    if fences is not None:
        fences.update(found)
    horizon = None if max_clock_skew is None else now + max_clock_skew
    verdicts = []
    for report in reports:
        last = found.get(report.node)
        verdicts.append(classify(
            last_sequence=None if last is None else last.last_sequence,
            last_sent_at=None if last is None else last.last_sent_at,
            sequence=report.sequence,
            sent_at=report.sent_at,
            horizon=horizon,
        ))
    applying = [r for r, v in zip(reports, verdicts, strict=True) if v.applies]
    if not applying:
        return verdicts
    inserts = [{"name": r.node, "first_seen_at": now, "reports_total": 1, "cordoned": False,
                **_node_values(r, now)} for r in applying if r.node not in found]
    updates = [{"b_node": r.node, **_node_values(r, now)} for r in applying if r.node in found]
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for report in applying:
        rows["gpus"] += _gpu_rows(report, now)
        rows["replicas"] += _replica_rows(report, now)
        rows["samples"] += _sample_rows(report)
        rows["events"] += _event_rows(report, now)
    if rows["events"]:
        rows["events"] = _unseen_events(conn, rows["events"])
    on_postgresql = conn.dialect.name == "postgresql"
    copies = [t for t in ("gpus", "replicas", "samples", "events")
              if on_postgresql and len(rows[t]) > COPY_FROM_ROWS]
    # PostgreSQL: the statements go out together and their results come back together (psycopg's pipeline
    # mode), one round trip instead of one each; COPY cannot run in a pipeline, so it follows.
    with _pipeline(conn):
        if inserts:
            conn.execute(_NODE_INSERT, inserts)
        if updates:
            conn.execute(_NODE_UPDATE, updates)
        # Each report is its node's full picture: replace the nodes' latest GPU and replica rows wholesale.
        key = {"b_nodes": [r.node for r in applying]}
        conn.execute(_DELETE_GPUS, key)
        conn.execute(_DELETE_REPLICAS, key)
        for table in ("gpus", "replicas", "samples", "events"):
            if rows[table] and table not in copies:
                conn.execute(_INSERTS[table], rows[table])
    for table in copies:
        _copy(conn, _INSERTS[table].table, rows[table])  # type: ignore[arg-type]
    return verdicts


def desired_state(*, session: Session, node: str, report_interval_seconds: float | None = None) -> DesiredState:
    """The answer to one node's report (``desired_states`` for one node)."""
    return desired_states(session=session, nodes=[node], report_interval_seconds=report_interval_seconds)[node]


def _replica_spec(row: Any) -> ReplicaSpec:
    """One desired-replica row as the agent reads it; a stack dump is asked for the generation it was set for."""
    return ReplicaSpec(name=row.name, generation=row.generation, engine_args=list(row.engine_args),
                       enabled=row.enabled, capture_stack=row.capture_stack_generation == row.generation,
                       live_cap=row.live_cap)


def _answer(node: str, fence: Any, specs: list[ReplicaSpec], report_interval_seconds: float | None) -> DesiredState:
    """The desired state of ``node`` from its specs and its node row's cordons (``fence``; None: unknown node)."""
    return DesiredState(
        node=node,
        cordoned=bool(fence is not None and fence.cordoned),
        cordoned_gpus=sorted(fence.cordoned_gpus or []) if fence is not None else [],
        replicas=specs,
        report_interval_seconds=report_interval_seconds,
    )


def _pipeline(conn: Connection) -> AbstractContextManager[object]:
    if conn.dialect.name != "postgresql":
        return nullcontext()
    pipeline: AbstractContextManager[object] = conn.connection.driver_connection.pipeline()  # type: ignore[union-attr]
    return pipeline


def _converter(column: Column[Any]) -> Callable[[Any], Any] | None:
    """How a value is written in COPY's text form where psycopg's own adaptation would not match the column."""
    if isinstance(column.type, JSON):
        return lambda v: None if v is None else json.dumps(v, separators=(",", ":"))
    if isinstance(column.type, UtcDateTime):
        stored = column.type
        return lambda v: None if v is None else stored.process_bind_param(v, _PG)
    return None


def _copy(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """PostgreSQL: write ``rows`` with one COPY (a fraction of the cost of one INSERT per row, which is how a
    driver runs a many-row INSERT). The columns are the rows' keys; values are bound as the ORM types would."""
    names = list(rows[0])
    columns = [table.c[name] for name in names]
    convert = [_converter(c) for c in columns]
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    quoted = ", ".join(f'"{name}"' for name in names)
    with cursor, cursor.copy(f'COPY "{table.name}" ({quoted}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row([v if f is None else f(v) for f, v in zip(convert, (row[n] for n in names),
                                                                     strict=True)])


def desired_states(*, session: Session, nodes: Sequence[str], report_interval_seconds: float | None = None,
                   fences: dict[str, Any] | None = None) -> dict[str, DesiredState]:
    """The answer to each node's report: what ``ingest.desired_state`` gives for one node, for all of them.

    ``fences``: the nodes' cordons as ``apply_reports`` read them in this transaction (a node it did not find
    is new, so not cordoned); None reads them here.
    """
    if not nodes:
        return {}
    conn = session.connection()
    specs: dict[str, list[ReplicaSpec]] = defaultdict(list)
    for row in conn.execute(_DESIRED_OF, {"b_nodes": list(nodes)}):
        specs[row.node].append(_replica_spec(row))
    if fences is None:
        fences = {row.name: row for row in conn.execute(_CORDONED, {"b_nodes": list(nodes)})}
    return {node: _answer(node, fences.get(node), specs.get(node, []), report_interval_seconds)
            for node in nodes}
