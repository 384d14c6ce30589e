"""Readings an agent could not deliver, stored in place as history (``agent.wire.Readings``).

Each reading becomes the samples its report would have written, at its ``sent_at``, and nothing else of it is
applied: the node's and its replicas' latest state, their events and the node's sequence stay as the live
reports left them, so a late reading never moves "now". The policy rounds' history cache takes the rows by id
and files them by time (``controlplane.remediation.history``): the next round sees no hole.

A reading is refused, with the reason, when it is stamped ahead of this control plane's clock (past
``max_clock_skew_seconds``), when it is older than the full-resolution window (``sample_full_resolution_seconds``:
retention has folded that stretch into one-minute averages already, and a raw point there would stand beside
its own average), or when its node is no longer in the fleet. A replica's or GPU's part of a reading is refused
when the node no longer runs it; the rest of the reading is stored. A reading already held (its node has samples
stored at its instant: a report's samples are one row) is not stored again: an agent sends again what it cannot
know was delivered.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from agent.wire import NodeReport, Readings, ReadingsAnswer, RefusedReading
from controlplane.fleet.ingest import gpu_series_values
from controlplane.policy.signals import stored_values
from controlplane.store.models import Gpu, Node, NodeSamples, Replica
from controlplane.store.samples import node_row


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
    candidates: list[tuple[NodeReport, dict[str, Any] | None]] = []
    for reading in batch.readings:
        if (problem := _whole_reading_problem(reading, now, oldest, max_skew)) is not None:
            refused.append(_refusal(reading, problem))
            continue
        items: list[tuple[str, str, dict[str, Any]]] = []
        for g in reading.gpus:
            if str(g.index) not in gpus:
                refused.append(_refusal(reading, f"node {node} no longer lists GPU {g.index}", f"gpu {g.index}"))
            else:
                items.append(("gpu", str(g.index), gpu_series_values(g)))
        for r in reading.replicas:
            if r.name not in replicas:
                refused.append(_refusal(reading, f"node {node} no longer runs replica {r.name}", f"replica {r.name}"))
            else:
                items.append(("replica", r.name, stored_values(r)))
        candidates.append((reading, node_row(node, reading.sent_at, items)))
    held = _held(session, node, [reading.sent_at for reading, _ in candidates])
    stored = duplicates = 0
    new_rows: list[dict[str, Any]] = []
    for reading, row in candidates:
        if row is None:
            continue
        if reading.sent_at in held:
            duplicates += 1  # a report's samples are stored whole, one row: this one was stored before
            continue
        stored += 1
        new_rows.append(row)
        held.add(reading.sent_at)  # repeated in one batch
    if new_rows:
        session.execute(insert(NodeSamples), new_rows)
    return ReadingsAnswer(stored=stored, duplicates=duplicates, refused=refused)


def _held(session: Session, node: str, times: list[datetime]) -> set[datetime]:
    """Which of ``times`` ``node`` has raw samples stored at (one range read of ``ix_node_samples_node_at``)."""
    if not times:
        return set()
    wanted = set(times)
    stored = session.scalars(select(NodeSamples.at).where(
        NodeSamples.node == node, NodeSamples.resolution_seconds == 0, NodeSamples.at >= min(times),
        NodeSamples.at <= max(times)))
    return {at for at in stored if at in wanted}
