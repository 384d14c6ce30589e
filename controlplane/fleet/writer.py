"""``ReportWriter``: one thread writes every agent report, committing the reports that queued together at once.

Reports arrive on many request threads; writing each in its own transaction cost about ten statements and a
commit per report, and on PostgreSQL at 200 reports a second that was more than two cores could give. Here the
request hands its parsed report over and waits on a future; the writer takes whatever has queued while it
was busy (up to ``max_batch``) and applies it in one transaction (``ingest.apply_reports``). Under light load a
batch is one report and costs what it did before; under heavy load batches grow and the cost per report
falls, so the writer keeps up instead of falling behind (group commit, as databases do with their logs).

A node's second report in one batch waits for the next batch, so its reports are applied in arrival order.
If a batch fails on a statement, it is rolled back and its reports are written one transaction each, so one
bad report fails alone; if the database is unreachable, the whole batch fails at once. The backlog is bounded
(``max_pending``): past it ``submit`` raises ``Backlogged`` and the agent retries later, so a database outage
costs the control plane neither unbounded memory nor requests that hang. On SQLite the one writer is also what
the database wants: no request thread waits on its lock.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from agent.wire import DesiredState, NodeReport
from controlplane.fleet.ingest import apply_reports, desired_states
from controlplane.fleet.sequencing import Verdict
from controlplane.store.db import session_scope

log = logging.getLogger(__name__)


class Written(NamedTuple):
    """What became of one report: the verdict, the node's answer, and for a report dropped as out of order the
    node's last accepted sequence and ``sent_at`` (what the agent is told to carry on past)."""

    verdict: Verdict
    answer: DesiredState
    last_sequence: int | None = None
    last_sent_at: datetime | None = None


@dataclass
class _Pending:
    report: NodeReport
    future: Future[Written] = field(default_factory=Future)


class Backlogged(Exception):
    """More reports wait to be written than the writer holds: refuse this one (the agent retries)."""


class ReportWriter:
    """Applies submitted reports in batches on one thread; ``submit`` returns a future of ``Written``."""

    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], datetime], *,
                 report_interval_seconds: float | None = None, max_batch: int = 64, max_pending: int = 2000,
                 on_batch: Callable[[int], None] | None = None, max_clock_skew_seconds: float | None = None) -> None:
        self._sessions = sessions
        self._clock = clock
        self._max_skew = None if max_clock_skew_seconds is None else timedelta(seconds=max_clock_skew_seconds)
        self._interval = report_interval_seconds
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._on_batch = on_batch
        self._pending = 0  # submitted and not yet answered
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._held: list[_Pending] = []  # reports of nodes already in the batch being written
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, report: NodeReport) -> Future[Written]:
        """Queue ``report`` for writing; the future fails with the write's exception if it cannot be stored."""
        pending = _Pending(report)
        with self._lock:
            if self._stopping:
                raise RuntimeError("the report writer is stopped")
            if self._pending >= self._max_pending:
                raise Backlogged(f"{self._pending} reports are waiting to be written")
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="report-writer", daemon=True)
                self._thread.start()
            self._queue.put(pending)
        return pending.future

    @property
    def pending(self) -> int:
        """Reports submitted and not yet answered (the writer's backlog)."""
        return self._pending

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then end the thread."""
        with self._lock:
            self._stopping = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _next_batch(self) -> tuple[list[_Pending], bool]:
        """Held reports first, then what queued meanwhile (blocking only when there is nothing at all)."""
        batch: list[_Pending] = []
        nodes: set[str] = set()
        held, self._held = self._held, []
        stop = False

        def take(item: _Pending) -> None:
            if item.report.node in nodes or len(batch) >= self._max_batch:
                self._held.append(item)
            else:
                nodes.add(item.report.node)
                batch.append(item)

        for item in held:
            take(item)
        if not batch:
            first = self._queue.get()
            if first is None:
                return batch, True
            take(first)
        while len(batch) < self._max_batch:
            try:
                queued = self._queue.get_nowait()
            except queue.Empty:
                break
            if queued is None:
                stop = True
                break
            take(queued)
        return batch, stop

    def _run(self) -> None:
        stop = False
        while not stop or self._held:
            batch, stop = self._next_batch()
            if batch:
                self._write(batch)
        while True:  # reports submitted after the stop marker (a race with stop()) fail rather than hang
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._fail([item], RuntimeError("the report writer is stopped"))

    def _write(self, batch: list[_Pending]) -> None:
        reports = [p.report for p in batch]
        try:
            with session_scope(self._sessions) as session:
                fences: dict[str, Any] = {}
                verdicts = apply_reports(session=session, reports=reports, now=self._clock(), fences=fences,
                                         max_clock_skew=self._max_skew)
                answers = desired_states(session=session, nodes=[r.node for r in reports],
                                         report_interval_seconds=self._interval, fences=fences)
        except Exception as exc:
            if len(batch) == 1 or isinstance(exc, OperationalError):  # one report, or no database to write to
                log.warning("%d report(s) not written: %s", len(batch), exc)
                self._fail(batch, exc)
                return
            log.warning("a batch of %d reports failed; writing them one by one", len(batch), exc_info=True)
            for pending in batch:
                self._write([pending])
            return
        if self._on_batch is not None:
            self._on_batch(len(batch))
        self._settled(batch)
        for pending, verdict in zip(batch, verdicts, strict=True):
            node = pending.report.node
            last = fences.get(node) if verdict is Verdict.OUT_OF_ORDER else None
            pending.future.set_result(Written(verdict, answers[node]) if last is None else
                                      Written(verdict, answers[node], last.last_sequence, last.last_sent_at))

    def _fail(self, batch: list[_Pending], exc: BaseException) -> None:
        self._settled(batch)
        for pending in batch:
            pending.future.set_exception(exc)

    def _settled(self, batch: list[_Pending]) -> None:
        """Take ``batch`` off the backlog count, before its futures wake their requests."""
        with self._lock:
            self._pending -= len(batch)

