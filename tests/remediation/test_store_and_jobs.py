"""The breaker's table arrives by migration; a reset forgets old failures; a report triggers a policy round."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

import controlplane.rounds
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.policy.guardrails import ActionRecord, GuardConfig, GuardState, breaker_check
from controlplane.store.db import current_revision, head_revision, make_engine, migrate
from tests.controlplane.fixtures import T0, FakeClock
from tests.helpers import wait_until
from tests.remediation.fleet import SimAgent, SimReplica, server_config
from tests.remediation.test_guarded_flows import STALL, policy_dir, wedge


def test_migrating_from_0002_adds_the_breaker_and_keeps_actions(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        migrate(engine, "0002")
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO actions (kind, target_kind, target, params, state, reason, evidence, guardrails, "
                "replicas, disruptive, requested_by, created_at, updated_at, outcome) VALUES ('restart', "
                "'replica', 'replica:a/r0', '{}', 'succeeded', '', '[]', '[]', '[]', 1, 'ops', "
                "'2026-11-29 12:00:00', '2026-11-29 12:00:00', 'ok')"))
        migrate(engine)
        assert current_revision(engine) == head_revision()
        assert "breaker_state" in inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM actions")).scalar() == 1
    finally:
        engine.dispose()


def test_a_breaker_reset_forgets_the_failures_before_it() -> None:
    failures = [ActionRecord(policy="stall", kind="restart", target=f"replica:a/r{i}", at=T0, status="failed")
                for i in range(3)]
    config = GuardConfig(breaker_max_failures=3)
    assert breaker_check(GuardState(records=failures), config, T0 + timedelta(minutes=1)) is not None
    after_reset = GuardState(records=failures, breaker_reset_at=T0 + timedelta(seconds=30))
    assert breaker_check(after_reset, config, T0 + timedelta(minutes=1)) is None
    again = [*failures, *(f.model_copy(update={"at": T0 + timedelta(seconds=40)}) for f in failures)]
    assert breaker_check(GuardState(records=again, breaker_reset_at=T0 + timedelta(seconds=30)), config,
                         T0 + timedelta(minutes=1)) is not None


def _stall_only(tmp_path: Path) -> tuple[SimAgent, FakeClock, ServerConfig]:
    """Two replicas, the stall policy alone, rounds only after reports (the interval is an hour)."""
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    policies = policy_dir(tmp_path, stall=STALL % "")
    config = server_config(tmp_path, policy_dirs=[str(policies)], policy_defaults=False,
                           policy_interval_seconds=3600, policy_debounce_seconds=0.05,
                           executor_interval_seconds=3600)
    return agent, FakeClock(T0), config

def test_a_report_triggers_a_policy_round_without_waiting_for_the_interval(tmp_path: Path) -> None:
    agent, clock, config = _stall_only(tmp_path)
    with TestClient(create_app(config, clock=clock)) as client:
        wedge(agent, "r0")
        for _ in range(5):  # 50 s of a wedged engine, reported as fast as the test can
            clock.advance(10)
            agent.report(client, clock, 10)

        def restarted() -> bool:
            rows = client.get("/v1/actions", params={"policy": "stall"}).json()
            return any(a["kind"] == "restart" and a["state"] == "running" for a in rows)

        wait_until(restarted, timeout=60, what="a restart recorded and applied after the reports")  # not 3600 s


def test_reports_that_come_while_a_round_runs_get_a_round_of_their_own(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The first round reads the store after the first report, then is held while the rest arrive: the rounds
    # their pokes schedule fire while it runs and are skipped, so only a round after it can act on them.
    agent, clock, config = _stall_only(tmp_path)
    held, release, rounds = threading.Event(), threading.Event(), []
    real_round = controlplane.rounds.run_round

    def first_round_held(**kw: Any) -> Any:
        result = real_round(**kw)
        rounds.append(kw["now"])
        if len(rounds) == 1:
            held.set()
            release.wait(30)
        return result

    monkeypatch.setattr(controlplane.rounds, "run_round", first_round_held)
    with TestClient(create_app(config, clock=clock)) as client:
        wedge(agent, "r0")
        clock.advance(10)
        agent.report(client, clock, 10)
        wait_until(held.is_set, timeout=30, what="the first round, on the first report")
        for _ in range(4):  # 40 s more of a wedged engine while that round runs
            clock.advance(10)
            agent.report(client, clock, 10)
        release.set()

        def restarted() -> bool:
            rows = client.get("/v1/actions", params={"policy": "stall"}).json()
            return any(a["kind"] == "restart" and a["state"] == "running" for a in rows)

        wait_until(restarted, timeout=60, what="a restart from a round after the held one")
        assert len(rounds) >= 2
