"""The replicas as a table pages them (``GET /v1/replicas?view=table``): those matching the filters, in the order
asked, one page of lean rows, how many match in all, and the values each filter can pick.

At thousands of replicas the full read (a ``ReplicaOut`` each: log tail, flags, every reading) is megabytes and
most of a second, for a table that shows a page of it. Here the order comes from each match's key and the one
column or reading it sorts on (a reading's sort decodes each match's sample: the slowest order, a tenth of a
second at 8,000); then only the page's rows are read, and of them only the columns a table shows. The text
filter reads the flags of each replica the other filters pass and matches in Python (case-insensitive, in
``node/name`` or the flags joined by spaces): the same match on every database, which SQL over a JSON column
would not give.

A sort puts unknown readings last in either direction (an engine that reports no TTFT is not the fastest), and
breaks ties by ``node`` then ``name``, so paging through a sort neither skips nor repeats a row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from agent.wire import LiveLimits, salvage
from controlplane.fleet.queries import Match, node_status, reading, replica_filters
from controlplane.fleet.schemas import (
    EngineColumns,
    NodeStatus,
    ProcessColumns,
    ReplicaFacets,
    ReplicaRow,
    ReplicaTable,
)
from controlplane.store.models import Node, Replica

# What a table sorts by: a column of the row, or a reading of its engine or process sample by its wire name.
# ``node`` is the default: by node, then name.
COLUMN_SORTS: dict[str, InstrumentedAttribute[Any]] = {
    "node": Replica.node, "name": Replica.name, "model": Replica.model, "state": Replica.state,
    "generation": Replica.generation, "restarts_total": Replica.restarts_total,
    "state_since": Replica.state_since, "updated_at": Replica.updated_at,
}
ENGINE_SORTS = ("ttft_p99_seconds", "itl_p99_seconds", "e2e_p99_seconds", "requests_running", "requests_waiting",
                "kv_cache_usage_ratio", "generation_tokens_per_second", "requests_per_second", "errors_per_second")
PROCESS_SORTS = ("rss_bytes", "cpu_percent", "gpu_memory_bytes")
SORTS = (*COLUMN_SORTS, *ENGINE_SORTS, *PROCESS_SORTS)
# A sort key, ``-`` first for descending.
SORT_PATTERN = f"^-?({'|'.join(SORTS)})$"
# The rows of one page: its keys are one IN list, and a table shows far fewer than the most.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_TEXT = 200
_ROW = (Replica.node, Replica.name, Replica.model, Replica.state, Replica.ready, Replica.generation, Replica.gpus,
        Replica.engine_args, Replica.restarts_total, Replica.state_since, Replica.updated_at, Replica.engine,
        Replica.process, Replica.live_limits)


def _matches(row: Sequence[Any], needle: str) -> bool:
    flags = " ".join(str(a) for a in row[3] or ()) if isinstance(row[3], list) else ""
    return needle in f"{row[0]}/{row[1]}".lower() or needle in flags.lower()


def ordered_keys(*, session: Session, node: Match = None, model: Match = None, state: Match = None,
                 text: str = "", sort: str = "node") -> list[tuple[str, str]]:
    """Every matching replica's (node, name), in ``sort``'s order: one read of the keys and the sort's source."""
    key, descending = sort.removeprefix("-"), sort.startswith("-")
    if key not in SORTS:
        raise ValueError(f"cannot sort replicas by {key!r}: one of {', '.join(SORTS)}")
    source = COLUMN_SORTS.get(key, Replica.engine if key in ENGINE_SORTS else Replica.process)
    needle = text.strip().lower()
    columns = [Replica.node, Replica.name, source, *([Replica.engine_args] if needle else [])]
    rows: Sequence[Sequence[Any]] = session.execute(
        select(*columns).where(*replica_filters(node=node, model=model, state=state))
        .order_by(Replica.node, Replica.name)).all()
    if needle:
        rows = [r for r in rows if _matches(r, needle)]
    if key == "node":
        return [(r[0], r[1]) for r in (reversed(rows) if descending else rows)]
    known: list[tuple[Any, tuple[str, str]]] = []
    unknown: list[tuple[str, str]] = []
    for r in rows:
        value = r[2] if key in COLUMN_SORTS else reading(r[2], key) if isinstance(r[2], Mapping) else None
        if value is None:
            unknown.append((r[0], r[1]))
        else:
            known.append((value, (r[0], r[1])))
    # Stable, in (node, name) order, ``reverse`` included: ties stay in key order either way.
    known.sort(key=lambda pair: pair[0], reverse=descending)
    return [k for _, k in known] + unknown


def _engine(sample: Any) -> EngineColumns | None:
    if not isinstance(sample, Mapping):
        return None
    stalled = sample.get("stalled")
    return EngineColumns(**{f: reading(sample, f) for f in ("ttft_p99_seconds", "itl_p99_seconds",
                                                              "requests_waiting", "kv_cache_usage_ratio")},
                         stalled=stalled if isinstance(stalled, bool) else None)


def _process(sample: Any) -> ProcessColumns | None:
    if not isinstance(sample, Mapping):
        return None
    rss = reading(sample, "rss_bytes")
    return ProcessColumns(rss_bytes=None if rss is None else int(rss))


def table_rows(*, session: Session, now: datetime, stale_after: timedelta,
               keys: Sequence[tuple[str, str]]) -> list[ReplicaRow]:
    """The rows of ``keys``, in their order; a replica removed since its key was read is left out."""
    if not keys:
        return []
    found = {(r.node, r.name): r for r in session.execute(
        select(*_ROW).where(tuple_(Replica.node, Replica.name).in_(list(keys))))}
    seen: dict[str, datetime] = {name: at for name, at in session.execute(
        select(Node.name, Node.last_report_at).where(Node.name.in_({n for n, _ in keys})))}
    rows = []
    for k in keys:
        if (r := found.get(k)) is None:
            continue
        at = seen.get(r.node)
        status = NodeStatus.STALE if at is None else node_status(last_report_at=at, now=now, stale_after=stale_after)
        rows.append(ReplicaRow(
            node=r.node, node_status=status, name=r.name, model=r.model, state=r.state, ready=r.ready,
            generation=r.generation, gpus=list(r.gpus or ()), engine_args=list(r.engine_args or ()),
            restarts_total=r.restarts_total, state_since=r.state_since, updated_at=r.updated_at,
            engine=_engine(r.engine), process=_process(r.process),
            live_limits=None if r.live_limits is None else salvage(LiveLimits, r.live_limits)))
    return rows


def facets(session: Session) -> ReplicaFacets:
    def per(column: InstrumentedAttribute[str]) -> dict[str, int]:
        counts = session.execute(select(column, func.count()).group_by(column).order_by(column))
        return {str(value): int(n) for value, n in counts}

    return ReplicaFacets(model=per(Replica.model), node=per(Replica.node), state=per(Replica.state))


def replica_table(*, session: Session, now: datetime, stale_after: timedelta, node: Match = None,
                  model: Match = None, state: Match = None, text: str = "", sort: str = "node", offset: int = 0,
                  limit: int = DEFAULT_LIMIT) -> ReplicaTable:
    """Rows ``offset`` to ``offset + limit`` of the replicas matching every filter given, ``total`` counting
    them all."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"a page holds 1 to {MAX_LIMIT} rows, not {limit}")
    keys = ordered_keys(session=session, node=node, model=model, state=state, text=text, sort=sort)
    page = keys[offset:offset + limit]
    return ReplicaTable(total=len(keys), offset=offset, limit=limit, sort=sort,
                        replicas=table_rows(session=session, now=now, stale_after=stale_after, keys=page),
                        facets=facets(session))
