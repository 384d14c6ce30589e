"""The readings the control plane has not got: kept while it is away, sent oldest first once it answers.

A partition must not leave a hole in every series of the node: while reports fail, the agent goes on taking a
reading every report interval (``agent.node``) and keeps each here, as the JSON its report would have carried,
less its events and XIDs (those stay queued for the next live report, which delivers them once). Once a live
report is delivered again, the backlog goes to ``POST /v1/agents/{node}/readings``, oldest first, one batch
after each delivered live report: the current state is never held back behind the past
(``controlplane.fleet.backfill`` stores them in place). Only readings taken before that live report go: the
control plane learns the node's GPUs and replicas from live reports, so a reading taken while a slow report was
still in flight (the node's first, say, sent before any GPU was read) could name a GPU the control plane has not
heard of yet and be refused as one the node no longer lists. It waits for the next live report, taken after it.

Bounded by age (``report_backlog_seconds``, measured on the readings' own clock) and by size: the oldest
reading goes first, counted in ``dropped_total``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from agent.wire import MAX_READINGS_PER_BATCH, PROTOCOL_VERSION, NodeReport

# A batch's body at most (the control plane takes four times its report limit, 1 MiB by default).
BATCH_BYTES = 1024 * 1024
# The backlog's size at most, whatever its age: 15 minutes of a 64-replica node at 1 s is ~60 MiB of JSON.
MAX_BACKLOG_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Kept:
    sequence: int
    sent_at: datetime
    body: bytes  # the reading as JSON, ready to join into a batch


def as_reading(report: NodeReport) -> NodeReport:
    """``report`` as the backlog keeps it: without its events and XIDs, which the next live report carries."""
    return report.model_copy(update={"events": [], "gpus": [g.model_copy(update={"xids": []}) for g in report.gpus]})


class Backlog:
    def __init__(self, node: str, keep_seconds: float, max_bytes: int = MAX_BACKLOG_BYTES) -> None:
        self.node = node
        self.keep = timedelta(seconds=keep_seconds)
        self.max_bytes = max_bytes
        self._kept: deque[Kept] = deque()
        self._bytes = 0
        self.kept_total = 0  # readings ever kept
        self.dropped_total = 0  # readings given up for age or size, never sent
        self.sent_total = 0  # readings the control plane answered for (stored, held already, or refused)
        self.refused_total = 0  # readings, or parts of them, the control plane refused (with a reason it logged)

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def enabled(self) -> bool:
        return self.keep > timedelta(0)

    def keep_report(self, report: NodeReport) -> None:
        """Keep the reading ``report`` carried (a report that was not delivered, or one taken while the control
        plane was away); drop what is now past the bounds, oldest first."""
        if not self.enabled:
            return
        reading = as_reading(report)
        body = reading.model_dump_json().encode()
        kept = Kept(reading.sequence, reading.sent_at, body)
        # In time order: a report that failed after its timeout comes after the readings taken while it waited.
        at = len(self._kept)
        while at and self._kept[at - 1].sent_at > kept.sent_at:
            at -= 1
        self._kept.insert(at, kept)
        self._bytes += len(body)
        self.kept_total += 1
        horizon = self._kept[-1].sent_at - self.keep
        while self._kept and (self._kept[0].sent_at < horizon or self._bytes > self.max_bytes):
            self._bytes -= len(self._kept.popleft().body)
            self.dropped_total += 1

    def batch(self, through: int | None = None) -> tuple[int, bytes] | None:
        """The oldest readings as one ``Readings`` body, within ``BATCH_BYTES`` and ``MAX_READINGS_PER_BATCH``, and
        only those taken before the report numbered ``through`` (the last delivered live one; numbers, unlike
        clocks, never step back): (how many, the body). None when nothing is kept, or nothing that old."""
        if not self._kept:
            return None
        parts: list[bytes] = []
        size = 0
        for kept in self._kept:
            if through is not None and kept.sequence > through:
                break
            if parts and (len(parts) >= MAX_READINGS_PER_BATCH or size + len(kept.body) > BATCH_BYTES):
                break
            parts.append(kept.body)
            size += len(kept.body) + 1
        if not parts:
            return None
        head = f'{{"protocol_version":{PROTOCOL_VERSION},"node":"{self.node}","readings":['.encode()
        return len(parts), head + b",".join(parts) + b"]}"

    def delivered(self, count: int) -> None:
        """The oldest ``count`` readings got an answer: done with them."""
        count = min(count, len(self._kept))
        for _ in range(count):
            self._bytes -= len(self._kept.popleft().body)
        self.sent_total += count

    def drop(self, count: int) -> None:
        """Give up on the oldest ``count`` readings (a batch the control plane cannot take)."""
        count = min(count, len(self._kept))
        for _ in range(count):
            self._bytes -= len(self._kept.popleft().body)
        self.dropped_total += count

    def clear(self) -> int:
        """Give up on every kept reading (a control plane that cannot take them); how many were dropped."""
        dropped = len(self._kept)
        self.drop(dropped)
        return dropped
