"""``PolicyRounds``: one policy round at a time, with the leader's history cache and the duty cap.

A round re-reads changed policy files, builds the fleet snapshot (new samples only, from the history
cache), evaluates, guards and records the decisions, then applies what was approved at once. While another
control plane leads, ``follow`` keeps the same cache current (a warm standby), so taking the lead costs one
delta read instead of the whole window (docs/design.md, "Failover"). The same
object runs in the API process (embedded apps, tests) or in the policy process ``pitstop server`` starts
(``controlplane.policy_process``), where a large fleet's evaluation cannot hold up the report path.

After each round, ``run_urgent`` runs one more for the nodes whose replicas changed state since that round read
the store (an agent's verdict: WEDGED, a crash) and those on which a condition under way completed its ``for:``
while it ran, reading what is new of those nodes alone: at fleet scale, where rounds run back to back, such a
moment is acted on when the round under way ends, not a whole round later (docs/design.md, "Urgent rounds").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ServerConfig
from controlplane.heap import HeapFreezer
from controlplane.policy.incremental import Evaluator
from controlplane.policy.shards import Part
from controlplane.remediation.executor import apply_approved
from controlplane.remediation.history import SampleHistory
from controlplane.remediation.loop import RoundResult, run_round
from controlplane.remediation.policyset import PolicySet
from controlplane.remediation.snapshot import FleetRows
from controlplane.shards import shard_leases_for
from controlplane.store.db import session_scope
from controlplane.store.models import ReplicaEventRow

log = logging.getLogger(__name__)
# Rounds quicker than this never delay the next one (small fleets, tests); slower ones obey policy_max_duty.
SLOW_ROUND_SECONDS = 0.5
# Where the policy-evaluation job plugs in: called by the leader with a session and the time.
PolicyHook = Callable[[Session, datetime], None]


def round_pause(started: float, ended: float, max_duty: float) -> float:
    """When the next round may start: at once after a quick round, later after a slow one (duty cap)."""
    took = ended - started
    if took < SLOW_ROUND_SECONDS:
        return ended
    return ended + took * (1.0 / max_duty - 1.0)


class PolicyRounds:
    def __init__(self, *, sessions: sessionmaker[Session], config: ServerConfig, clock: Callable[[], datetime],
                 policy_hook: PolicyHook | None = None, heap: HeapFreezer | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self._config = config
        self._clock = clock
        self._policy_hook = policy_hook
        self._heap = heap
        self._monotonic = monotonic
        self.policies = PolicySet.from_config(config)
        # This control plane hears reports from now on: a node silent since before it started is not yet dark.
        self.reports_since = clock()
        self.guard_config = config.guard_config()
        # The in-memory sample history: the leader's rounds read it, a warm standby keeps it current (``follow``).
        self.samples = SampleHistory(timedelta(seconds=config.policy_history_seconds))
        # The rounds' memory of quiet subjects: each round judges again only what may have changed since.
        self.evaluator = Evaluator()
        # The replicas' and GPUs' latest rows: each round reads those of the nodes that reported since.
        self.rows = FleetRows()
        # The shards this control plane's rounds judge (the leader: all of them, unless rounds are spread).
        self.shards = shard_leases_for(config.database_url, config.policy_shards)
        self.part: Part | None = None
        self._running = threading.Lock()
        self._next_round_at = 0.0
        self._next_follow_at = 0.0
        self._forget = False
        # The last replica event a round's read covered: later state changes make an urgent round (``run_urgent``),
        # as do the last round's moments of conditions under way (``RoundResult.dues``) that have passed.
        self._events_seen: int | None = None
        self._dues: list[tuple[datetime, str]] = []
        self.last_round: RoundResult | None = None

    def holds(self, leader: bool) -> bool:
        """Whether this control plane's rounds judge anything now: take or hand back shards between rounds
        (never during one), and answer for the part held. ``leader``: whether this control plane leads.

        Holding nothing without ``policy_warm_standby``, the history is let go: another control plane judges
        now, and this one reads the window afresh if it judges again (``forget``)."""
        if self._running.acquire(blocking=False):
            try:
                self.part = self.shards.tick(leader)
            finally:
                self._running.release()
        if self.part is None and not self._config.policy_warm_standby:
            self.forget()
        return self.part is not None

    def release(self) -> None:
        """Hand back every shard (this control plane stops)."""
        self.shards.release()
        self.part = None

    def forget(self) -> None:
        """This control plane judges nothing now and will not follow: the next round reads the window afresh."""
        self._forget = True
        self._events_seen, self._dues = None, []

    def follow(self) -> int | None:
        """Another control plane leads: read the samples stored since the last read into the history, as a
        round would, and evaluate nothing; the rows added, or None when a round is running, the last follow was
        under ``policy_interval_seconds`` ago, or policies are off.

        The history is the samples table's, whichever control plane stored them, so what a standby reads stays
        valid when it takes the lead: its first round reads only the rows since its last ``follow``."""
        # At most once per interval: a follower behind a load balancer receives reports (and pokes) too.
        if not self._config.policies_enabled or self._monotonic() < self._next_follow_at:
            return None
        if not self._running.acquire(blocking=False):
            return None
        try:
            if self._forget:
                self.samples.clear()
                self.evaluator.clear()
                self.rows.clear()
                self._forget = False
            with self._collector_off(), session_scope(self._sessions) as session:
                added = self.samples.refresh(session, self._clock())
            # A standby's whole-window read delays no round: it must not count against the duty cap later.
            self.samples.cold_seconds = 0.0
            self._next_follow_at = self._monotonic() + self._config.policy_interval_seconds
            return added
        finally:
            self._running.release()

    def due(self) -> bool:
        return self._monotonic() >= self._next_round_at

    def run(self) -> tuple[RoundResult | None, float] | None:
        """One round and its duration; None when one is already running or the duty cap says wait."""
        if not self.due() or not self._running.acquire(blocking=False):
            return None
        started = self._monotonic()
        primed = self.evaluator.primed
        try:
            with self._collector_off():
                result = self._round()
        finally:
            ended = self._monotonic()
            # Reading the whole window once per leader term is not the steady cost the duty cap is for: a new
            # leader must not sit out minutes of rounds because its first one loaded the history. Nor is the
            # first round that judges every subject (the incremental evaluation has nothing to go on yet): the
            # rounds after it judge what changed.
            cold, self.samples.cold_seconds = self.samples.cold_seconds, 0.0
            if not primed:
                cold = ended - started
            self._next_round_at = round_pause(started + min(cold, ended - started), ended,
                                              self._config.policy_max_duty)
            self._running.release()
        return result, ended - started

    def run_urgent(self) -> tuple[RoundResult, float] | None:
        """A round for the nodes whose replicas changed state since the last round read the store, and those on
        which a condition under way at that round's clock has completed its ``for:`` since, and its duration: what
        is new is read of those nodes alone, every other node is as that round read it, and the policies judge the
        snapshot as any round does (the incremental evaluation walks what changed: those nodes' subjects, and
        answers that fell due). None when there is no such node, a round is running, or no round has read the
        store since this control plane began or last led. Once after each round: the dues are that round's.

        Best effort by design: a state change it misses (an event committed late, on PostgreSQL) is in the next
        whole round's read. Policy files are re-read by whole rounds only."""
        if not self._config.policies_enabled or self._events_seen is None or self._forget:
            return None
        if not self._running.acquire(blocking=False):
            return None
        started = self._monotonic()
        try:
            with self._collector_off():
                result = self._urgent_round(self._events_seen)
        finally:
            self._running.release()
        return None if result is None else (result, self._monotonic() - started)

    def _urgent_round(self, seen: int) -> RoundResult | None:
        now = self._clock()
        due, self._dues = {node for at, node in self._dues if at <= now}, []
        with session_scope(self._sessions) as session:
            changed = session.execute(select(ReplicaEventRow.id, ReplicaEventRow.node).where(
                ReplicaEventRow.id > seen, ReplicaEventRow.to_state.is_not(None))).all()
            nodes = due | {node for _, node in changed}
            if not nodes:
                return None
            result = self._judge(session, now, only=nodes)
        self._events_seen = max([seen, *(i for i, _ in changed)])
        # ``last_round`` stays the last whole round's.
        self._apply(result, f"urgent round ({len(nodes)} node(s): a change of state or a for: completed)")
        return result

    def _apply(self, result: RoundResult, what: str) -> None:
        """Apply at once what a round approved (and say what it recorded)."""
        if not result.recorded:
            return
        log.info("%s: %d proposed, recorded %s", what, result.proposed, result.recorded)
        applied = apply_approved(sessions=self._sessions, now=self._clock)
        if applied:
            log.info("executor: applied %s", applied)

    def _judge(self, session: Session, now: datetime, only: set[str] | None = None) -> RoundResult:
        return run_round(session=session, now=now, policies=self.policies.policies, guard_config=self.guard_config,
                         history=timedelta(seconds=self._config.policy_history_seconds), samples=self.samples,
                         reports_since=self.reports_since, evaluator=self.evaluator, rows=self.rows, part=self.part,
                         only=only)

    def _collector_off(self) -> AbstractContextManager[None]:
        """The garbage collector's automatic passes off for a round or a follow, and one collection and freeze at
        its end (``HeapFreezer.during_round``); unchanged without a freezer (tests, one-off tools)."""
        return self._heap.during_round() if self._heap is not None else nullcontext()

    def _round(self) -> RoundResult | None:
        if self._forget:
            self.samples.clear()  # another replica led in between: what it stored is read afresh
            self.evaluator.clear()
            self.rows.clear()
            self._forget = False
        result = None
        if self._config.policies_enabled:
            now = self._clock()
            self.policies.refresh(now)
            with session_scope(self._sessions) as session:
                # Read before the round reads the rest: a state change stored from here on gets an urgent round.
                events = session.scalar(select(func.max(ReplicaEventRow.id))) or 0
                result = self._judge(session, now)
            self._events_seen, self._dues = events, result.dues
            self.last_round = result
            self._apply(result, "policy round")
        if self._policy_hook is not None:
            with session_scope(self._sessions) as session:
                self._policy_hook(session, self._clock())
        return result
