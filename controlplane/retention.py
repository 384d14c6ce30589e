"""Sample retention: raw points for a while, then one-minute averages, then nothing.

A replica's signals fold as their table declares (``policy.signals``): most by their mean, the settings and
identities (generation, running limit, argument digest) by their last value, the scrape window not at all.

``downsample`` is the pure part; ``prune_samples`` applies it in one transaction; ``RetentionLoop.run_once``
is one round, which the leader's scheduler (``controlplane.jobs``) runs every ``retention_interval_seconds``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ServerConfig
from controlplane.policy.signals import ROLLUPS, Rollup
from controlplane.store.db import session_scope
from controlplane.store.models import NodeSamples
from controlplane.store.samples import node_row, readable

log = logging.getLogger(__name__)
BUCKET_SECONDS = 60


def bucket_start(at: datetime, width: int) -> datetime:
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % width, UTC)


Point = tuple[datetime, dict[str, Any]]


def downsample(points: Iterable[Point], width: int,
               rollups: Mapping[str, Rollup] | None = None) -> list[tuple[datetime, dict[str, float]]]:
    """Fold each field over ``width``-second buckets as ``rollups`` says (a replica's signals:
    ``policy.signals.ROLLUPS``): its mean, its last value, or nothing; a field it does not name (a GPU's) is
    averaged when it is a number. A field absent from a point is not a zero."""
    rules = rollups or {}
    kept: dict[datetime, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for at, values in sorted(points, key=itemgetter(0)):
        bucket = kept[bucket_start(at, width)]
        for key, value in values.items():
            if rules.get(key) != "drop" and isinstance(value, int | float) and not isinstance(value, bool):
                bucket[key].append(float(value))
    return [(start, {k: v[-1] if rules.get(k) == "last" else sum(v) / len(v) for k, v in fields.items()})
            for start, fields in sorted(kept.items())]


@dataclass(frozen=True)
class PruneResult:
    deleted: int
    downsampled: int
    buckets: int


def prune_samples(*, session: Session, now: datetime, full_resolution: timedelta, retention: timedelta,
                  width: int = BUCKET_SECONDS) -> PruneResult:
    """Delete samples past ``retention``; fold raw samples older than ``full_resolution`` into buckets, one packed
    row per node and bucket. The counts are of rows: one holds a node's samples at one instant or bucket."""
    expired = session.execute(delete(NodeSamples).where(NodeSamples.at < now - retention))
    deleted = int(getattr(expired, "rowcount", 0) or 0)
    # Only whole buckets are folded, so a bucket is never written twice.
    cutoff = bucket_start(now - full_resolution, width)
    old = session.execute(select(NodeSamples.id, NodeSamples.node, NodeSamples.at, NodeSamples.data).where(
        NodeSamples.resolution_seconds == 0, NodeSamples.at < cutoff)).all()
    series: dict[str, dict[tuple[str, str], list[Point]]] = defaultdict(lambda: defaultdict(list))
    for (_, node, at, _), entries in readable(old):
        for kind, subject, values in entries:
            series[node][(kind, subject)].append((at, values))
    buckets = 0
    for node, subjects in series.items():
        by_start: dict[datetime, list[tuple[str, str, dict[str, float]]]] = defaultdict(list)
        for (kind, subject), points in subjects.items():
            for start, values in downsample(points, width, ROLLUPS if kind == "replica" else None):
                by_start[start].append((kind, subject, values))
        rows = [row for start, items in sorted(by_start.items())
                if (row := node_row(node, start, items, resolution_seconds=width)) is not None]
        buckets += len(rows)
        if rows:
            session.execute(insert(NodeSamples), rows)
    if old:
        ids = [row[0] for row in old]
        for i in range(0, len(ids), 5_000):  # bounded IN lists
            session.execute(delete(NodeSamples).where(NodeSamples.id.in_(ids[i:i + 5_000])))
    return PruneResult(deleted=deleted, downsampled=len(old), buckets=buckets)


class RetentionLoop:
    """One retention round over the app's sessions, with the app's clock and settings."""

    def __init__(self, sessions: sessionmaker[Session], *, clock: Callable[[], datetime], config: ServerConfig):
        self._sessions = sessions
        self._clock = clock
        self._config = config

    def run_once(self) -> PruneResult:
        with session_scope(self._sessions) as session:
            return prune_samples(
                session=session, now=self._clock(),
                full_resolution=timedelta(seconds=self._config.sample_full_resolution_seconds),
                retention=timedelta(seconds=self._config.sample_retention_seconds),
            )
