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

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ServerConfig
from controlplane.policy.signals import ROLLUPS, Rollup
from controlplane.store.db import session_scope
from controlplane.store.models import Sample

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
    """Delete samples past ``retention``; fold raw samples older than ``full_resolution`` into buckets."""
    expired = session.execute(delete(Sample).where(Sample.at < now - retention))
    deleted = int(getattr(expired, "rowcount", 0) or 0)
    # Only whole buckets are folded, so a bucket is never written twice.
    cutoff = bucket_start(now - full_resolution, width)
    old = session.scalars(select(Sample).where(Sample.resolution_seconds == 0, Sample.at < cutoff)).all()
    groups: dict[tuple[str, str, str], list[Sample]] = defaultdict(list)
    for s in old:
        groups[(s.node, s.subject_kind, s.subject)].append(s)
    buckets = 0
    for (node, kind, subject), rows in groups.items():
        rollups = ROLLUPS if kind == "replica" else None
        for start, values in downsample(((r.at, r.values) for r in rows), width, rollups):
            session.add(Sample(node=node, subject_kind=kind, subject=subject, at=start,
                               resolution_seconds=width, values=values))
            buckets += 1
        for r in rows:
            session.delete(r)
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
