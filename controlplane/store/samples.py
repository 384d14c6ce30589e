"""Reading and writing the samples store: one ``node_samples`` row per node per instant (``store.packing``).

Writers hand a node's subjects at one time to ``node_row``; readers ask for one subject's series
(``subject_series``), several nodes' series of one kind (``series_of``), or walk rows themselves and
``unpack`` them (the policy rounds' history, retention). A row that cannot be read is skipped and logged once
per read, never fatal: one corrupt value must not blind the policy rounds to the rest of the fleet.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.store.models import NodeSamples
from controlplane.store.packing import PackError, Values, pack, unpack

log = logging.getLogger(__name__)
# (time, bucket width or 0, values) of one subject.
Point = tuple[datetime, int, Values]
# Rows read per query when looking for one subject's newest points (a subject may be missing from some rows).
_PAGE = 500


def node_row(node: str, at: datetime, samples: Iterable[tuple[str, str, Mapping[str, Any]]],
             resolution_seconds: int = 0) -> dict[str, Any] | None:
    """The row for ``samples`` of ``node`` at ``at`` (None when there is nothing to store)."""
    items = [(kind, subject, values) for kind, subject, values in samples if values]
    if not items:
        return None
    return {"node": node, "at": at, "resolution_seconds": resolution_seconds, "data": pack(items)}


def readable(rows: Iterable[tuple[Any, ...]], data_at: int = -1) -> Iterable[tuple[tuple[Any, ...],
                                                                              list[tuple[str, str, Values]]]]:
    """Each row with its unpacked subjects (``data_at``: the column holding the packed value); rows that cannot
    be read are skipped, with one log line per call naming how many and the first."""
    bad = 0
    for row in rows:
        try:
            yield row, unpack(row[data_at])
        except PackError as exc:
            if not bad:
                log.error("skipping stored samples that cannot be read (row %s): %s", row[0], exc)
            bad += 1
    if bad > 1:
        log.error("skipped %d rows of stored samples that could not be read", bad)


def subject_series(session: Session, *, node: str, kind: str, subject: str, since: datetime | None = None,
                   newest: int | None = None, raw_only: bool = False) -> list[Point]:
    """One subject's points, oldest first: all of them since ``since``, or the newest ``newest``. One range scan
    of ``ix_node_samples_node_at`` (paged from the newest end when ``newest`` is given)."""
    query = select(NodeSamples.id, NodeSamples.at, NodeSamples.resolution_seconds, NodeSamples.data).where(
        NodeSamples.node == node)
    if since is not None:
        query = query.where(NodeSamples.at >= since)
    if raw_only:
        query = query.where(NodeSamples.resolution_seconds == 0)
    wanted = (kind, subject)
    if newest is None:
        return [(at, width, values) for (_, at, width, _), entries in readable(session.execute(
                query.order_by(NodeSamples.at, NodeSamples.id))) for k, s, values in entries if (k, s) == wanted]
    found: list[Point] = []
    before: tuple[datetime, int] | None = None
    while len(found) < newest:
        page = query.order_by(NodeSamples.at.desc(), NodeSamples.id.desc()).limit(_PAGE)
        if before is not None:
            at, row_id = before
            page = page.where((NodeSamples.at < at) | ((NodeSamples.at == at) & (NodeSamples.id < row_id)))
        rows = session.execute(page).all()
        for (_, at, width, _), entries in readable(rows):
            found += [(at, width, values) for k, s, values in entries if (k, s) == wanted]
        if len(rows) < _PAGE:
            break
        before = (rows[-1][1], rows[-1][0])
    found = found[:newest]
    found.reverse()
    return found


def series_of(session: Session, *, kind: str, since: datetime, nodes: Sequence[str] | None = None,
              raw_only: bool = False) -> dict[tuple[str, str], list[tuple[datetime, Values]]]:
    """Every ``kind`` subject's points since ``since`` by ``(node, subject)``, oldest first (``nodes``: only
    those nodes')."""
    query = select(NodeSamples.id, NodeSamples.node, NodeSamples.at, NodeSamples.data).where(
        NodeSamples.at >= since)
    if nodes is not None:
        query = query.where(NodeSamples.node.in_(list(nodes)))
    if raw_only:
        query = query.where(NodeSamples.resolution_seconds == 0)
    out: dict[tuple[str, str], list[tuple[datetime, Values]]] = defaultdict(list)
    for (_, node, at, _), entries in readable(session.execute(query.order_by(NodeSamples.at, NodeSamples.id))):
        for k, subject, values in entries:
            if k == kind:
                out[(node, subject)].append((at, values))
    return out
