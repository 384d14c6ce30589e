"""Apply several agents' reports in one transaction (group commit), with multi-row statements.

``apply_reports`` has the meaning of calling ``ingest.apply_report`` for each report in turn, for reports from
distinct nodes: the same sequencing verdicts, the same rows. It costs a fixed number of statements per batch
instead of about ten per report, and one commit, which is what lets one control plane keep up with a
thousand agents on PostgreSQL (each statement is a round trip through SQLAlchemy, psycopg and a backend).
``desired_states`` answers every node of the batch with two queries.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, Connection, Table, bindparam, delete, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from agent.wire import DesiredState, NodeReport, ReplicaSpec
from controlplane.fleet import ingest
from controlplane.fleet.sequencing import Verdict, classify
from controlplane.store.models import UtcDateTime

_NODES, _DESIRED = ingest._NODES, ingest._DESIRED
# The fences (node and GPU cordons) are read here too: one round trip fewer than asking again for the answer.
_NODES_LAST = (select(_NODES.c.name, _NODES.c.last_sequence, _NODES.c.last_sent_at, _NODES.c.cordoned,
                      _NODES.c.cordoned_gpus)
               .where(_NODES.c.name.in_(bindparam("b_nodes", expanding=True))))
_NODE_UPDATE = (update(_NODES).where(_NODES.c.name == bindparam("b_node"))
                .values(reports_total=_NODES.c.reports_total + 1))
_DELETE_GPUS = delete(ingest._GPUS).where(ingest._GPUS.c.node.in_(bindparam("b_nodes", expanding=True)))
_DELETE_REPLICAS = delete(ingest._REPLICAS).where(ingest._REPLICAS.c.node.in_(bindparam("b_nodes", expanding=True)))
# No RETURNING of generated keys: inside a pipeline no result is read until the end (a one-row INSERT would
# otherwise ask for its new id at once).
_INSERTS = {name: statement.inline() for name, statement in ingest._INSERTS.items()}
_DESIRED_OF = (select(_DESIRED.c.node, _DESIRED.c.name, _DESIRED.c.generation, _DESIRED.c.engine_args,
                      _DESIRED.c.enabled, _DESIRED.c.capture_stack_generation)
               .where(_DESIRED.c.node.in_(bindparam("b_nodes", expanding=True)))
               .order_by(_DESIRED.c.node, _DESIRED.c.name))
_CORDONED = (select(_NODES.c.name, _NODES.c.cordoned, _NODES.c.cordoned_gpus)
             .where(_NODES.c.name.in_(bindparam("b_nodes", expanding=True))))


def apply_reports(*, session: Session, reports: Sequence[NodeReport], now: datetime,
                  fences: dict[str, Any] | None = None) -> list[Verdict]:
    """Store each report that is news; return the verdicts in the order of ``reports``.

    The reports must come from distinct nodes (a batch holds a node's reports one at a time, in order).
    ``fences``, when given, receives each known node's row with its ``cordoned`` and ``cordoned_gpus``.
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
    verdicts = []
    for report in reports:
        last = found.get(report.node)
        verdicts.append(classify(
            last_sequence=None if last is None else last.last_sequence,
            last_sent_at=None if last is None else last.last_sent_at,
            sequence=report.sequence,
            sent_at=report.sent_at,
        ))
    applying = [r for r, v in zip(reports, verdicts, strict=True) if v.applies]
    if not applying:
        return verdicts
    inserts = [{"name": r.node, "first_seen_at": now, "reports_total": 1, "cordoned": False,
                **ingest._node_values(r, now)} for r in applying if r.node not in found]
    updates = [{"b_node": r.node, **ingest._node_values(r, now)} for r in applying if r.node in found]
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for report in applying:
        rows["gpus"] += ingest._gpu_rows(report, now)
        rows["replicas"] += ingest._replica_rows(report, now)
        rows["samples"] += ingest._sample_rows(report)
        rows["events"] += ingest._event_rows(report, now)
    postgresql = conn.dialect.name == "postgresql"
    copies = [t for t in ("gpus", "replicas", "samples", "events") if postgresql and len(rows[t]) > COPY_FROM_ROWS]
    # PostgreSQL: the statements go out together and their results come back together (psycopg's pipeline
    # mode), one round trip instead of one each; COPY cannot run in a pipeline, so it follows.
    with _pipeline(conn):
        if inserts:
            conn.execute(ingest._NODE_INSERT, inserts)
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
        _copy(conn, ingest._INSERTS[table].table, rows[table])  # type: ignore[arg-type]
    return verdicts


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


_PG = postgresql.dialect()
# Fewer rows go as one pipelined INSERT each (one round trip); COPY costs two but far less per row.
COPY_FROM_ROWS = 24


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
        specs[row.node].append(ingest.replica_spec(row))
    if fences is None:
        fences = {row.name: row for row in conn.execute(_CORDONED, {"b_nodes": list(nodes)})}
    return {node: ingest.answer(node, fences.get(node), specs.get(node, []), report_interval_seconds)
            for node in nodes}
