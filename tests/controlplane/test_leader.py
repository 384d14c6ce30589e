"""Several control planes on one PostgreSQL: one leader, failover within a poll period, actions applied once."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.leader import AdvisoryLockLeadership
from controlplane.policy.guardrails import Decision, Verdict
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation.executor import apply_approved
from controlplane.remediation.records import record_decision
from controlplane.store.db import make_engine, make_sessionmaker, session_scope
from controlplane.store.models import ActionRow, DesiredReplica
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import wait_until

pytestmark = pytest.mark.slow
POLL = 0.3


def leaders(*clients: TestClient) -> list[bool]:
    return [c.app.state.pitstop.leadership.is_leader for c in clients]  # type: ignore[attr-defined]


def test_one_leader_and_failover_when_it_stops(postgres_url: str, clock) -> None:
    config = ServerConfig(database_url=postgres_url, leader_poll_seconds=POLL, executor_interval_seconds=POLL)
    with ExitStack() as stack:
        a = stack.enter_context(TestClient(create_app(config, clock=clock)))
        b = stack.enter_context(TestClient(create_app(config, clock=clock)))
        wait_until(lambda: sum(leaders(a, b)) == 1, timeout=5, what="one leader")
        assert leaders(a, b) == [True, False]
        assert "pitstop_cp_leader 1.0" in a.get("/metrics").text
        assert "pitstop_cp_leader 0.0" in b.get("/metrics").text
        a.__exit__(None, None, None)  # the leader stops: its lock connection closes
        wait_until(lambda: leaders(b) == [True], timeout=POLL * 4, what="the follower to take over")
        assert b.get("/readyz").status_code == 200


def test_a_leader_whose_connection_dies_steps_down(postgres_url: str) -> None:
    first, second = AdvisoryLockLeadership(postgres_url), AdvisoryLockLeadership(postgres_url)
    try:
        assert first.tick() and not second.tick()
        # Kill the leader's backend, as a crashed host or a network cut would.
        with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'")
        # The signal is sent at once, but the lock goes only when that backend has exited: the standby takes it
        # on one of its next polls.
        wait_until(second.tick, timeout=5, interval=0.05, what="the standby to take the lock")
        assert not first.tick()  # its next check finds the connection gone
    finally:
        first.release()
        second.release()


def test_two_executors_apply_each_action_exactly_once(postgres_url: str, clock) -> None:
    with TestClient(create_app(ServerConfig(database_url=postgres_url), clock=clock, run_jobs=False)) as c:
        names = [f"r{i}" for i in range(12)]
        models = {n: f"m{i}" for i, n in enumerate(names)}  # one model each: no budget in the way
        c.post("/v1/agents/gpu-a/report", json=body(report(replicas=[replica(n, model=models[n]) for n in names])))
    engines = [make_engine(postgres_url) for _ in range(2)]
    try:
        sessions = [make_sessionmaker(e) for e in engines]
        with session_scope(sessions[0]) as session:
            for n in names:
                proposal = ProposedAction(policy="itl-slo", kind="restart", reason="slow", model=models[n],
                                          target=Target(kind="replica", node="gpu-a", replica=n),
                                          replicas=[f"gpu-a/{n}"])
                record_decision(session=session, decision=Decision(action=proposal, verdict=Verdict.ALLOWED),
                                now=clock(), requested_by="policy:itl-slo", policy="itl-slo")
        applied: list[list[int]] = [[], []]
        start = threading.Barrier(2)

        def run(i: int) -> None:
            start.wait()
            applied[i] = apply_approved(sessions=sessions[i], now=clock)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(applied[0] + applied[1]) == sorted(set(applied[0]) | set(applied[1]))
        assert len(applied[0]) + len(applied[1]) == len(names)
        with session_scope(sessions[0]) as session:
            assert set(session.scalars(select(ActionRow.state))) == {"running"}
            # Each replica went up exactly one generation (1 -> 2), never two.
            assert sorted(session.scalars(select(DesiredReplica.generation))) == [2] * len(names)
    finally:
        for e in engines:
            e.dispose()

def test_a_stopped_leaders_lock_is_free_when_release_returns(postgres_url: str) -> None:
    """A clean stop hands the lock back on the wire: the standby's very next poll leads, with no wait for the old
    backend to exit."""
    first, second = AdvisoryLockLeadership(postgres_url), AdvisoryLockLeadership(postgres_url)
    try:
        assert first.tick() and not second.tick()
        first.release()
        assert second.tick(), "the standby leads on its first poll after the leader stopped"
    finally:
        first.release()
        second.release()
