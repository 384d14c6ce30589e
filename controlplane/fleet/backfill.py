"""Readings an agent could not deliver, stored in place as history (``agent.wire.Readings``).

Each reading becomes the samples its report would have written, at its ``sent_at``, and nothing else of it is
applied: the node's and its replicas' latest state, their events and the node's sequence stay as the live
reports left them, so a late reading never moves "now". The policy rounds' history cache takes the rows by id
and files them by time (``controlplane.remediation.history``): the next round sees no hole.

A reading is refused, with the reason, when it is stamped ahead of this control plane's clock (past
``max_clock_skew_seconds``), when it is older than the full-resolution window (``sample_full_resolution_seconds``:
retention has folded that stretch into one-minute averages already, and a raw point there would stand beside
its own average), or when its node is no longer in the fleet. A replica's or GPU's part of a reading is refused
when the node no longer runs it; the rest of the reading is stored. A sample already held (same node, subject
and instant) is not stored again: an agent sends again what it cannot know was delivered.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from agent.wire import NodeReport, Readings, ReadingsAnswer, RefusedReading
from controlplane.fleet.ingest import gpu_series_values
from controlplane.policy.signals import stored_values
from controlplane.store.models import Gpu, Node, Replica, Sample


def _refusal(reading: NodeReport, reason: str, subject: str | None = None) -> RefusedReading:
    return RefusedReading(sequence=reading.sequence, sent_at=reading.sent_at, subject=subject, reason=reason)


def _whole_reading_problem(reading: NodeReport, now: datetime, oldest: datetime,
                           max_skew: timedelta) -> str | None:
    ahead = (reading.sent_at - now).total_seconds()
    if ahead > max_skew.total_seconds():
        return (f"stamped {ahead:.0f} s ahead of the control plane's clock (at most {max_skew.total_seconds():g} s "
                "of skew is accepted, max_clock_skew_seconds): check the clocks (NTP)")
    if reading.sent_at < oldest:
        return (f"older than the store's full-resolution window (taken {(now - reading.sent_at).total_seconds():.0f} s "
                f"ago; raw samples are kept {(now - oldest).total_seconds():g} s, "
                "sample_full_resolution_seconds): that stretch is averaged already")
    return None


def store_readings(*, session: Session, batch: Readings, now: datetime, full_resolution: timedelta,
                   max_skew: timedelta) -> ReadingsAnswer:
    """Store ``batch``'s readings as samples of its node; say what was stored, held already, or refused."""
    node = batch.node
    if session.get(Node, node) is None:
        reason = f"node {node} is not in the fleet (removed, or it never reported): nothing to file these under"
        return ReadingsAnswer(refused=[_refusal(r, reason) for r in batch.readings])
    replicas = set(session.scalars(select(Replica.name).where(Replica.node == node)))
    gpus = {str(i) for i in session.scalars(select(Gpu.index).where(Gpu.node == node))}
    oldest = now - full_resolution
    refused: list[RefusedReading] = []
    candidates: list[tuple[NodeReport, list[dict[str, Any]]]] = []
    for reading in batch.readings:
        if (problem := _whole_reading_problem(reading, now, oldest, max_skew)) is not None:
            refused.append(_refusal(reading, problem))
            continue
        rows: list[dict[str, Any]] = []
        for g in reading.gpus:
            if str(g.index) not in gpus:
                refused.append(_refusal(reading, f"node {node} no longer lists GPU {g.index}", f"gpu {g.index}"))
            elif values := gpu_series_values(g):
                rows.append({"node": node, "subject_kind": "gpu", "subject": str(g.index), "at": reading.sent_at,
                             "resolution_seconds": 0, "values": values})
        for r in reading.replicas:
            if r.name not in replicas:
                refused.append(_refusal(reading, f"node {node} no longer runs replica {r.name}", f"replica {r.name}"))
            elif replica_values := stored_values(r):
                rows.append({"node": node, "subject_kind": "replica", "subject": r.name, "at": reading.sent_at,
                             "resolution_seconds": 0, "values": replica_values})
        candidates.append((reading, rows))
    held = _held(session, node, [reading.sent_at for reading, _ in candidates])
    stored = duplicates = 0
    new_rows: list[dict[str, Any]] = []
    for _reading, rows in candidates:
        fresh = [row for row in rows if (row["subject_kind"], row["subject"], row["at"]) not in held]
        if rows and not fresh:
            duplicates += 1
        elif fresh:
            stored += 1
            new_rows.extend(fresh)
            held.update((row["subject_kind"], row["subject"], row["at"]) for row in fresh)  # repeated in one batch
    if new_rows:
        session.execute(insert(Sample), new_rows)
    return ReadingsAnswer(stored=stored, duplicates=duplicates, refused=refused)


def _held(session: Session, node: str, times: list[datetime]) -> set[tuple[str, str, datetime]]:
    """The raw samples of ``node`` already stored at any of ``times`` (one range read over the subject index)."""
    if not times:
        return set()
    wanted = set(times)
    rows = session.execute(select(Sample.subject_kind, Sample.subject, Sample.at).where(
        Sample.node == node, Sample.resolution_seconds == 0, Sample.at >= min(times), Sample.at <= max(times)))
    return {(kind, subject, at) for kind, subject, at in rows if at in wanted}
