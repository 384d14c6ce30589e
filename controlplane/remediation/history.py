"""``SampleHistory``: the leader's incremental copy of recent sample histories, for the policy rounds.

A policy round needs every replica's and GPU's recent history. Reading it whole from the store each round
costs a 1,000-node fleet about 2.9 million samples (8 replicas and 8 GPUs per node, a report every 5 s,
15 minutes; 180,000 packed rows): seconds of decoding per round. The leader instead keeps the window in memory and reads
only the rows written since its last round.

New rows are found by id. On PostgreSQL ids are handed out before commit, so a row can become visible after
rows with larger ids: each refresh lists the ids of the last ``overlap_rows`` (integers only, cheap) and
fetches any it has not seen, so a report that committed late still lands in the history. SQLite has one
writer, so ids arrive in order there. A leader that starts (or takes over) reads the window once.

A round may also read ahead for a few nodes only (``refresh(..., only=...)``: an urgent round, ``rounds``): their
new rows are added and their ids remembered, the watermark stays, and the next whole refresh skips those rows, so
every row lands in the history once.
"""

from __future__ import annotations

import time
from bisect import bisect_left, insort
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.policy.signals import ReplicaSample, from_stored
from controlplane.policy.snapshot import GpuReading
from controlplane.store.models import NodeSamples
from controlplane.store.samples import readable

Key = tuple[str, str, str]  # (node, subject kind, subject)
_COLUMNS = (NodeSamples.id, NodeSamples.node, NodeSamples.at, NodeSamples.data)


def gpu_reading(at: datetime, values: dict[str, Any]) -> GpuReading:
    """A stored GPU sample as the engine's ``GpuReading`` (``xids`` and ``throttle_reasons`` are lists, kept
    only when non-empty; a one-minute average has neither)."""
    memory, xid, ecc = values.get("memory_used_bytes"), values.get("xid_events_total"), values.get(
        "ecc_uncorrected_total")
    xids, reasons = values.get("xids"), values.get("throttle_reasons")
    return GpuReading(at=at, temperature_celsius=values.get("temperature_celsius"),
                      memory_used_bytes=None if memory is None else int(memory),
                      xid_events_total=None if xid is None else int(xid),
                      ecc_uncorrected_total=None if ecc is None else int(ecc),
                      xids=tuple(int(c) for c in xids) if isinstance(xids, list) else (),
                      throttle_reasons=_shared_reasons(tuple(reasons)) if isinstance(reasons, list) else ())


@lru_cache(maxsize=1024)
def _shared_reasons(reasons: tuple[str, ...]) -> tuple[str, ...]:
    # A loaded GPU reads sw_power_cap in nearly every sample: one tuple per distinct set, not one per sample.
    return reasons


def _at(point: ReplicaSample | GpuReading) -> datetime:
    return point.at


class SampleHistory:
    """Per-subject, time-ordered histories of the last ``horizon``, kept up to date by ``refresh``."""

    def __init__(self, horizon: timedelta, overlap_rows: int = 2_000) -> None:
        self.horizon = horizon
        self.overlap_rows = overlap_rows
        self._series: dict[Key, list[Any]] = {}
        self._watermark: int | None = None  # the largest id read so far; None until the first refresh
        self.cold_seconds = 0.0  # time spent reading whole windows (a new leader term), for the duty cap
        self._seen: set[int] = set()  # ids read in the overlap window, to skip on the next refresh
        self._ahead: set[int] = set()  # ids above the watermark read for some nodes only (``only``)
        # Nodes whose histories gained or lost a sample since ``take_touched`` last ran (a snapshot built from
        # this cache rebuilds only those nodes' subjects: ``snapshot.FleetRows``).
        self._touched: set[str] = set()

    def clear(self) -> None:
        """Forget everything (leadership lost: the next leader term reads the window afresh)."""
        self._series.clear()
        self._seen.clear()
        self._ahead.clear()
        self._touched.clear()
        self._watermark = None

    def take_touched(self) -> set[str]:
        """The nodes whose histories changed since the last call (samples added, or aged out of the window)."""
        touched, self._touched = self._touched, set()
        return touched

    def refresh(self, session: Session, now: datetime, only: set[str] | None = None) -> int:
        """Read the rows written since the last refresh, drop what fell out of the window; rows added.

        ``only``: read the new rows of these nodes alone (the window must have been read already); the next
        refresh without it reads everything else, and not these rows again."""
        since = now - self.horizon
        if only is not None:
            if self._watermark is None:
                raise ValueError("a refresh of some nodes needs the window read first")
            rows = [row for row in session.execute(
                select(*_COLUMNS).where(NodeSamples.id > self._watermark, NodeSamples.node.in_(sorted(only)))
                .order_by(NodeSamples.id)).all() if row[0] not in self._ahead]
            self._ahead.update(row[0] for row in rows)
            added = self._add(rows, since, note=False)
            self._trim(since)
            return added
        if self._watermark is None:
            began = time.perf_counter()
            # Streamed in batches: a 1,000-node fleet's window is millions of rows, and holding every
            # decoded row at once would take several times the memory of the history itself.
            query = (select(*_COLUMNS).where(NodeSamples.at >= since, NodeSamples.resolution_seconds == 0)
                     .order_by(NodeSamples.id).execution_options(yield_per=2_000))
            added = sum(self._add(batch, since) for batch in session.execute(query).partitions())
            self.cold_seconds += time.perf_counter() - began
        else:
            floor = self._watermark - self.overlap_rows
            recent = session.scalars(select(NodeSamples.id).where(NodeSamples.id > floor)).all()
            late = [i for i in recent if i <= self._watermark and i not in self._seen]
            added = self._add(session.execute(select(*_COLUMNS).where(NodeSamples.id > self._watermark)
                                              .order_by(NodeSamples.id)).all(), since)
            if late:
                added += self._add(session.execute(select(*_COLUMNS).where(NodeSamples.id.in_(late))).all(), since)
            if self._ahead:
                self._ahead = {i for i in self._ahead if i > self._watermark}  # read ahead, and now passed
        self._trim(since)
        return added

    def _add(self, rows: Sequence[Any], since: datetime, note: bool = True) -> int:
        added = 0
        series_of = self._series
        touched = self._touched
        ids = [row[0] for row in rows]
        ahead = self._ahead if note else ()
        for (row_id, node, at, _), entries in readable(rows):
            if at < since or row_id in ahead:
                continue  # out of the window, or read ahead for its node (``only``) and in the history already
            touched.add(node)
            for kind, subject, values in entries:
                point = from_stored(at, values) if kind == "replica" else gpu_reading(at, values)
                series = series_of.get((node, kind, subject))
                if series is None:
                    series_of[(node, kind, subject)] = [point]
                elif series[-1].at <= at:
                    series.append(point)
                else:
                    insort(series, point, key=_at)  # a report that arrived out of order
                added += 1
        if note:
            self._note(ids)
        return added

    def _note(self, ids: list[int]) -> None:
        """Move the watermark and remember the ids of the overlap window (read once, never twice)."""
        if not ids:
            return
        top = max(ids)
        if self._watermark is None or top > self._watermark:
            self._watermark = top
        floor = self._watermark - self.overlap_rows
        self._seen.update(i for i in ids if i > floor)
        if len(self._seen) > 2 * self.overlap_rows:
            self._seen = {i for i in self._seen if i > floor}

    def _trim(self, since: datetime) -> None:
        for key in list(self._series):
            series = self._series[key]
            if series[0].at >= since:
                continue  # nothing aged out: most series, in a round a second after the last
            self._touched.add(key[0])
            cut = bisect_left(series, since, key=_at)
            if cut == len(series):
                del self._series[key]
            else:
                del series[:cut]

    def _window(self, key: Key, since: datetime) -> list[Any]:
        series = self._series.get(key)
        if not series:
            return []
        return series[bisect_left(series, since, key=_at):]

    def replica(self, node: str, name: str, since: datetime) -> list[ReplicaSample]:
        """A copy of one replica's history from ``since`` (the snapshot must not change under evaluation)."""
        return self._window((node, "replica", name), since)

    def gpu(self, node: str, index: int, since: datetime) -> list[GpuReading]:
        return self._window((node, "gpu", str(index)), since)

    def __len__(self) -> int:
        return sum(len(s) for s in self._series.values())
