"""The policy loop, for control planes that do not run one yet: evaluate, guard and record every interval.

It does exactly what the leader's policy job is specified to do, with the product's own functions —
``build_snapshot`` from the server's store, ``evaluate`` (pure), ``guardrails.decide`` (pure) and
``record_decision`` — from the benchmark's process against the server's SQLite database; the server's executor
then applies what was approved. ``server_runs_policies`` tells whether the control plane has its own job
(a policy-interval setting), in which case the benchmarks use that and this is not started.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from controlplane.config import ServerConfig
from controlplane.policy.guardrails import Verdict, decide
from controlplane.policy_files import load_directory
from controlplane.remediation.records import guard_state, record_decision
from controlplane.remediation.snapshot import build_snapshot
from controlplane.store.db import make_engine, make_sessionmaker, session_scope

log = logging.getLogger(__name__)
POLICY_INTERVAL_SETTING = "policy_interval_seconds"


def server_runs_policies() -> bool:
    """True when ``pitstop server`` has its own policy-evaluation job (it takes a policy interval)."""
    return POLICY_INTERVAL_SETTING in ServerConfig.model_fields


class StandInLoop:
    """Evaluates ``policies`` against the server's database every ``interval`` seconds in a thread."""

    def __init__(self, database_url: str, policies: Path, *, interval: float = 1.0,
                 history: timedelta = timedelta(minutes=15)) -> None:
        from controlplane.policy.evaluate import evaluate  # the pure core, imported where it is used

        self._evaluate = evaluate
        self._policies = load_directory(policies)
        self._by_name = {p.name: p for p in self._policies}
        self._sessions = make_sessionmaker(make_engine(database_url))
        self._interval = interval
        self._history = history
        self.rounds = 0
        self.errors = 0
        self._suppressed: set[tuple[str, str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def once(self, now: datetime) -> int:
        """One round; returns how many actions were recorded."""
        with session_scope(self._sessions) as session:
            snapshot = build_snapshot(session=session, now=now, history=self._history)
            proposed = self._evaluate(self._policies, snapshot, now)
            if not proposed:
                return 0
            result = decide(proposed, guard_state(session=session, now=now), snapshot, now, self._by_name)
            recorded = 0
            for decision in result.decisions:
                a = decision.action
                key = (a.policy, a.kind, a.target.key)
                # A refusal repeats every round while the condition holds: keep the first one of a streak.
                if decision.verdict is Verdict.SUPPRESSED:
                    if key in self._suppressed:
                        continue
                    self._suppressed.add(key)
                else:
                    self._suppressed.discard(key)
                record_decision(session=session, decision=decision, now=now, requested_by="policy",
                                policy=a.policy)
                recorded += 1
            return recorded

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.once(datetime.now(UTC))
                self.rounds += 1
            except Exception:  # a locked database or a half-written report: the next round retries
                self.errors += 1
                log.exception("stand-in policy round failed")

    def __enter__(self) -> StandInLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
