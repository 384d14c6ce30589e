"""Scheduled jobs, run only by the leader: leader election, the executor, retention, policy evaluation.

One APScheduler ``BackgroundScheduler`` per app (no process-wide scheduler). Every job but the election
checks leadership first, so followers serve the API and nothing else. Each job does one round and returns;
errors are logged with the job's name and the next round retries (APScheduler keeps the timing).

The policy round runs every ``policy_interval_seconds`` and also ``policy_debounce_seconds`` after a report
(``poke``): a burst of reports within the debounce makes one round, not one per report. A slow round (a
large fleet) delays the next one so rounds use at most ``policy_max_duty`` of the time: reports come first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ServerConfig
from controlplane.leader import Leadership
from controlplane.policy.guardrails import GuardConfig
from controlplane.remediation.executor import apply_approved, reconcile
from controlplane.remediation.history import SampleHistory
from controlplane.remediation.loop import RoundResult, run_round
from controlplane.remediation.policyset import PolicySet
from controlplane.remediation.rollout import RolloutSettings
from controlplane.retention import RetentionLoop
from controlplane.store.db import session_scope

log = logging.getLogger(__name__)
# Rounds quicker than this never delay the next one (small fleets, tests); slower ones obey policy_max_duty.
SLOW_ROUND_SECONDS = 0.5
# Where the policy-evaluation job plugs in: called by the leader with a session and the time.
PolicyHook = Callable[[Session, datetime], None]


def rollout_settings(config: ServerConfig) -> RolloutSettings:
    return RolloutSettings(deadline=timedelta(seconds=config.action_deadline_seconds),
                           canary_window=timedelta(seconds=config.canary_window_seconds),
                           max_latency_regression=config.canary_max_latency_regression,
                           max_throughput_drop=config.canary_max_throughput_drop,
                           guard=GuardConfig.model_validate(config.guardrails))


class Jobs:
    def __init__(self, *, sessions: sessionmaker[Session], leadership: Leadership, config: ServerConfig,
                 clock: Callable[[], datetime], on_leadership: Callable[[bool], None] = lambda _: None,
                 policy_hook: PolicyHook | None = None, on_round: Callable[[float], None] = lambda _: None) -> None:
        self._sessions = sessions
        self._leadership = leadership
        self._config = config
        self._clock = clock
        self._on_leadership = on_leadership
        self._policy_hook = policy_hook
        self._on_round = on_round
        self._retention = RetentionLoop(sessions, clock=clock, config=config)
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self.policies = PolicySet.from_config(config)
        self.guard_config = GuardConfig.model_validate(config.guardrails)
        self.rollout = rollout_settings(config)
        self._evaluating = threading.Lock()
        self._monotonic = time.monotonic
        self._next_round_at = 0.0
        self._poke_lock = threading.Lock()
        self.last_round: RoundResult | None = None
        # The leader's in-memory sample history; a follower keeps none (it is cleared on losing the lead).
        self.samples = SampleHistory(timedelta(seconds=config.policy_history_seconds))
        self._forget_samples = False

    def elect(self) -> bool:
        leader = self._leadership.tick()
        if not leader:
            self._forget_samples = True  # cleared by the next round, which holds the round lock
        self._on_leadership(leader)
        return leader

    def execute(self) -> None:
        """Apply approved actions, then finish running ones whose outcome the agents have reported."""
        if not self._leadership.is_leader:
            return
        applied = apply_approved(sessions=self._sessions, now=self._clock)
        with session_scope(self._sessions) as session:
            finished = reconcile(session=session, now=self._clock(), deadline=self.rollout.deadline,
                                 settings=self.rollout)
        if applied or finished:
            log.info("executor: applied %s, finished %s", applied, finished)

    def retention(self) -> None:
        if self._leadership.is_leader:
            log.info("sample retention: %s", self._retention.run_once())

    def evaluate(self) -> RoundResult | None:
        """One policy round (skipped when one is already running), then apply what it approved at once."""
        if not self._leadership.is_leader or self._monotonic() < self._next_round_at:
            return None
        if not self._evaluating.acquire(blocking=False):
            return None
        started = self._monotonic()
        try:
            result = None
            if self._forget_samples:
                # Another replica led in between: what it stored while we followed is read afresh.
                self.samples.clear()
                self._forget_samples = False
            if self._config.policies_enabled:
                now = self._clock()
                self.policies.refresh(now)
                with session_scope(self._sessions) as session:
                    result = run_round(session=session, now=now, policies=self.policies.policies,
                                       guard_config=self.guard_config,
                                       history=timedelta(seconds=self._config.policy_history_seconds),
                                       samples=self.samples)
                self.last_round = result
                if result.recorded:
                    log.info("policy round: %d proposed, recorded %s", result.proposed, result.recorded)
                    applied = apply_approved(sessions=self._sessions, now=self._clock)
                    if applied:
                        log.info("executor: applied %s", applied)
            if self._policy_hook is not None:
                with session_scope(self._sessions) as session:
                    self._policy_hook(session, self._clock())
            return result
        finally:
            ended = self._monotonic()
            self._on_round(ended - started)
            self._next_round_at = self._round_pause(started, ended)
            self._evaluating.release()

    def _round_pause(self, started: float, ended: float) -> float:
        """When the next round may start: at once after a quick round, later after a slow one (duty cap)."""
        took = ended - started
        if took < SLOW_ROUND_SECONDS:
            return ended
        return ended + took * (1.0 / self._config.policy_max_duty - 1.0)

    def poke(self) -> None:
        """A report arrived: evaluate soon (once per debounce interval however many reports arrive)."""
        if not self._scheduler.running or not self._config.policies_enabled:
            return
        with self._poke_lock:
            if self._scheduler.get_job("evaluate_soon") is not None:
                return
            when = datetime.now(UTC) + timedelta(seconds=self._config.policy_debounce_seconds)
            self._scheduler.add_job(self.evaluate, "date", run_date=when, id="evaluate_soon", max_instances=1,
                                    misfire_grace_time=None)

    def start(self) -> None:
        self.elect()  # a lone control plane leads from its first request, not one poll later
        first = datetime.now(UTC)
        c = self._config
        for job, seconds in ((self.elect, c.leader_poll_seconds), (self.execute, c.executor_interval_seconds),
                             (self.evaluate, c.policy_interval_seconds)):
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
