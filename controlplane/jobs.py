"""Scheduled jobs, run only by the leader: leader election, the executor, retention, policy evaluation.

One APScheduler ``BackgroundScheduler`` per app (no process-wide scheduler). Every job but the election
checks leadership first, so followers serve the API and nothing else. Each job does one round and returns;
errors are logged with the job's name and the next round retries (APScheduler keeps the timing).

The policy round runs every ``policy_interval_seconds`` and also ``policy_debounce_seconds`` after a report
(``poke``): a burst of reports within the debounce makes one round, not one per report. A round that sees a
condition under way also books one for the moment its ``for:`` completes (``RoundResult.next_due``). A slow
round (a large fleet) delays the next one so rounds use at most ``policy_max_duty`` of the time: reports come
first.
``pitstop server`` runs the rounds in a process of their own (``controlplane.policy_process``), so they
never share this process's interpreter lock with the report path; embedded apps and tests run them here.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ConfigError, ServerConfig
from controlplane.heap import SETTLE_SECONDS, HeapFreezer
from controlplane.leader import Leadership
from controlplane.notify import notifier
from controlplane.notify.notifier import Links
from controlplane.notify.outbox import send_due
from controlplane.notify.secrets import NotifierConfigError, ResolvedNotifier, read_secret_file, resolve_secrets
from controlplane.policy.due import wait_seconds
from controlplane.policy.rollout import RolloutSettings
from controlplane.policy_process import PolicyProcess
from controlplane.remediation.executor import apply_approved, reconcile
from controlplane.remediation.loop import RoundResult
from controlplane.remediation.records import expire_proposals
from controlplane.retention import RetentionLoop
from controlplane.rounds import PolicyHook, PolicyRounds
from controlplane.store.db import session_scope

log = logging.getLogger(__name__)


def notifier_settings(config: ServerConfig) -> ResolvedNotifier:
    """The receivers with their secrets read from where the config says (files, the environment)."""
    try:
        return resolve_secrets(config.notifier, os.environ, read_secret_file)
    except NotifierConfigError as exc:
        raise ConfigError("\n".join(exc.errors)) from exc


def rollout_settings(config: ServerConfig) -> RolloutSettings:
    return RolloutSettings(deadline=timedelta(seconds=config.action_deadline_seconds),
                           settle=timedelta(seconds=config.rollout_settle_seconds),
                           canary_window=timedelta(seconds=config.canary_window_seconds),
                           max_latency_regression=config.canary_max_latency_regression,
                           max_throughput_drop=config.canary_max_throughput_drop,
                           canary_alpha=config.canary_alpha, guard=config.guard_config())


class Jobs:
    def __init__(self, *, sessions: sessionmaker[Session], leadership: Leadership, config: ServerConfig,
                 clock: Callable[[], datetime], on_leadership: Callable[[bool], None] = lambda _: None,
                 policy_hook: PolicyHook | None = None, on_round: Callable[[float, float], None] = lambda *_: None,
                 heap: HeapFreezer | None = None, policy_process: PolicyProcess | None = None,
                 on_notified: Callable[[str, str, int], None] = lambda *_: None) -> None:
        self._sessions = sessions
        self._leadership = leadership
        self._config = config
        self._clock = clock
        self._on_leadership = on_leadership
        self._on_round = on_round
        self._retention = RetentionLoop(sessions, clock=clock, config=config)
        self._scheduler = BackgroundScheduler(timezone=UTC)
        # In this process unless a policy process was given (``pitstop server``); the API's explain reads
        # ``policies`` and ``guard_config`` either way.
        self.rounds = PolicyRounds(sessions=sessions, config=config, clock=clock, policy_hook=policy_hook,
                                   heap=heap)
        self.process = policy_process
        self._heap = heap
        self.policies = self.rounds.policies
        self.guard_config = self.rounds.guard_config
        self.rollout = rollout_settings(config)
        self._poke_lock = threading.Lock()
        self._pokes = 0  # reports seen, for a round to tell whether one came while it ran
        self.notifier = notifier_settings(config)
        self._links = Links(external_url=config.external_url or "", runbook_base_url=config.runbook_base_url)
        self._receivers = notifier.receivers(self.notifier)
        self._on_notified = on_notified
        self._http: httpx.Client | None = None

    @property
    def last_round(self) -> RoundResult | None:
        return self.rounds.last_round

    @property
    def history_samples(self) -> int:
        """Samples the policy rounds' history holds (the leader's window, or a warm standby's)."""
        return self.process.history_samples if self.process is not None else len(self.rounds.samples)

    @property
    def shards_held(self) -> int:
        """Shards of the policy rounds this control plane holds (all of them on the leader unless spread)."""
        if self.process is not None:
            return self.process.shards_held
        return len(self.rounds.part.held) if self.rounds.part is not None else 0

    def settle_heap(self) -> None:
        """Collect and freeze this process's heap (``controlplane.heap``): with the rounds in a process of their
        own, nothing else does, and the collector's full passes would walk every long-lived object here."""
        if self._heap is not None:
            self._heap.after_round()

    def elect(self) -> bool:
        leader = self._leadership.tick()
        if self.process is not None:
            self.process.set_leader(leader)
        self._on_leadership(leader)
        return leader

    def execute(self) -> None:
        """Apply approved actions, then finish running ones whose outcome the agents have reported."""
        if not self._leadership.is_leader:
            return
        applied = apply_approved(sessions=self._sessions, now=self._clock)
        with session_scope(self._sessions) as session:
            expired = expire_proposals(session=session, now=self._clock(),
                                       ttl=timedelta(seconds=self._config.proposal_ttl_seconds))
            if expired:
                log.info("executor: expired proposals %s", expired)
            finished = reconcile(session=session, now=self._clock(), deadline=self.rollout.deadline,
                                 settings=self.rollout)
        if applied or finished:
            log.info("executor: applied %s, finished %s", applied, finished)

    def notify(self) -> None:
        """Queue the alert groups that are due, then send what the outbox has due (leader only)."""
        if not self._leadership.is_leader or not self._receivers:
            return
        with session_scope(self._sessions) as session:
            queued = notifier.queue(session=session, notifier=self.notifier, links=self._links, now=self._clock(),
                                    stale_after=timedelta(seconds=self._config.stale_after_seconds))
        if queued:
            log.info("notifier: queued deliveries %s", queued)
        if self._http is None:
            self._http = httpx.Client()
        for (receiver, outcome), n in send_due(sessions=self._sessions, receivers=self._receivers,
                                                client=self._http, now=self._clock).items():
            self._on_notified(receiver, outcome, n)

    def retention(self) -> None:
        if self._leadership.is_leader:
            log.info("sample retention: %s", self._retention.run_once())

    def evaluate(self) -> RoundResult | None:
        """One policy round in this process (skipped when one is running or the duty cap says wait), then
        apply what it approved at once. A follower keeps the rounds' sample history current instead."""
        if not self.rounds.holds(self._leadership.is_leader):
            if self._config.policy_warm_standby:
                self.rounds.follow()
            return None
        # A report's poke that comes while this round runs must get a round of its own after it: the scheduler
        # skips a debounced round that fires while one runs, and this one read the store before that report.
        pokes = self._pokes
        done = self.rounds.run()
        if done is None:
            return None
        self._on_round(done[1], self._clock().timestamp())  # its duration, and when it ended
        try:
            urgent = self.rounds.run_urgent()  # the moments that came while it ran
        except Exception:  # the next round reads what it would have
            log.exception("urgent policy round failed")
            urgent = None
        if self._pokes != pokes:
            self.poke()
        dues = [r.next_due for r in (done[0], urgent[0] if urgent else None) if r is not None and r.next_due]
        self._evaluate_when_due(min(dues, default=None))
        return done[0]

    def _evaluate_when_due(self, next_due: datetime | None) -> None:
        """A condition under way completes its ``for:`` before the next round would come: a round at that
        moment (``policy.due``), so acting never waits for the next report or interval past it."""
        if next_due is None or not self._scheduler.running:
            return
        interval = self._config.policy_interval_seconds
        wait = wait_seconds(next_due, self._clock(), interval)
        if wait >= interval:
            return  # the interval's own round comes first
        self._scheduler.add_job(self.evaluate, "date", run_date=datetime.now(UTC) + timedelta(seconds=wait),
                                id="evaluate_due", replace_existing=True, misfire_grace_time=None)

    def poke(self) -> None:
        """A report arrived: evaluate soon (once per debounce interval however many reports arrive)."""
        if not self._scheduler.running or not self._config.policies_enabled:
            return
        if self.process is not None:
            self.process.poke()
            return
        with self._poke_lock:
            self._pokes += 1
            if self._scheduler.get_job("evaluate_soon") is not None:
                return
            when = datetime.now(UTC) + timedelta(seconds=self._config.policy_debounce_seconds)
            self._scheduler.add_job(self.evaluate, "date", run_date=when, id="evaluate_soon", max_instances=1,
                                    misfire_grace_time=None)

    def start(self) -> None:
        if self.process is not None:
            self.process.start()
        self.elect()  # a lone control plane leads from its first request, not one poll later
        first = datetime.now(UTC)
        c = self._config
        jobs: list[tuple[Callable[[], object], float]] = [(self.elect, c.leader_poll_seconds),
                                                          (self.execute, c.executor_interval_seconds),
                                                          (self.notify, c.notify_interval_seconds)]
        if self.process is None:
            jobs.append((self.evaluate, c.policy_interval_seconds))
        elif self._heap is not None:
            jobs.append((self.settle_heap, SETTLE_SECONDS))
        for job, seconds in jobs:
            self._scheduler.add_job(job, "interval", seconds=seconds, id=job.__name__, max_instances=1,
                                    coalesce=True, next_run_time=first)
        # Retention is heavy and not urgent: its first round comes one interval after start.
        self._scheduler.add_job(self.retention, "interval", seconds=c.retention_interval_seconds, id="retention",
                                max_instances=1, coalesce=True)
        self._scheduler.start()

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        if self._http is not None:
            self._http.close()
        if self.process is not None:
            self.process.stop()
        self.rounds.release()
        self._leadership.release()
        self._on_leadership(False)
