"""Scheduled jobs, run only by the leader: leader election, the executor, retention, policy evaluation.

One APScheduler ``BackgroundScheduler`` per app (no process-wide scheduler). Every job but the election
checks leadership first, so followers serve the API and nothing else. Each job does one round and returns;
errors are logged with the job's name and the next round retries (APScheduler keeps the timing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ServerConfig
from controlplane.leader import Leadership
from controlplane.remediation.executor import apply_approved, reconcile
from controlplane.retention import RetentionLoop
from controlplane.store.db import session_scope

log = logging.getLogger(__name__)
# Where the policy-evaluation job plugs in: called by the leader with a session and the time.
PolicyHook = Callable[[Session, datetime], None]
POLICY_INTERVAL_SECONDS = 30.0


class Jobs:
    def __init__(self, *, sessions: sessionmaker[Session], leadership: Leadership, config: ServerConfig,
                 clock: Callable[[], datetime], on_leadership: Callable[[bool], None] = lambda _: None,
                 policy_hook: PolicyHook | None = None) -> None:
        self._sessions = sessions
        self._leadership = leadership
        self._config = config
        self._clock = clock
        self._on_leadership = on_leadership
        self._policy_hook = policy_hook
        self._retention = RetentionLoop(sessions, clock=clock, config=config)
        self._scheduler = BackgroundScheduler(timezone=UTC)

    def elect(self) -> bool:
        leader = self._leadership.tick()
        self._on_leadership(leader)
        return leader

    def execute(self) -> None:
        """Apply approved actions, then finish running ones whose outcome the agents have reported."""
        if not self._leadership.is_leader:
            return
        applied = apply_approved(sessions=self._sessions, now=self._clock)
        with session_scope(self._sessions) as session:
            finished = reconcile(session=session, now=self._clock(),
                                 deadline=timedelta(seconds=self._config.action_deadline_seconds))
        if applied or finished:
            log.info("executor: applied %s, finished %s", applied, finished)

    def retention(self) -> None:
        if self._leadership.is_leader:
            log.info("sample retention: %s", self._retention.run_once())

    def evaluate(self) -> None:
        if self._leadership.is_leader and self._policy_hook is not None:
            with session_scope(self._sessions) as session:
                self._policy_hook(session, self._clock())

    def start(self) -> None:
        self.elect()  # a lone control plane leads from its first request, not one poll later
        first = datetime.now(UTC)
        c = self._config
        for job, seconds in ((self.elect, c.leader_poll_seconds), (self.execute, c.executor_interval_seconds),
                             (self.evaluate, POLICY_INTERVAL_SECONDS)):
            self._scheduler.add_job(job, "interval", seconds=seconds, id=job.__name__, max_instances=1,
                                    coalesce=True, next_run_time=first)
        # Retention is heavy and not urgent: its first round comes one interval after start.
        self._scheduler.add_job(self.retention, "interval", seconds=c.retention_interval_seconds, id="retention",
                                max_instances=1, coalesce=True)
        self._scheduler.start()

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        self._leadership.release()
        self._on_leadership(False)
