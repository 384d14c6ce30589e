"""Rounds spread over control planes on one PostgreSQL: a fair share of the shards each, taken over when one
stops, one action per replica, and guardrails that stay fleet-wide."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.jobs import Jobs
from controlplane.policy.shards import Part, shard_of
from controlplane.remediation.loop import run_round
from controlplane.remediation.records import GUARD_LOCK_ID
from controlplane.shards import AdvisoryShardLeases
from controlplane.store.db import session_scope
from controlplane.store.models import ActionRow, AlertRow
from tests.controlplane.fixtures import T0, FakeClock
from tests.helpers import wait_until
from tests.remediation.fleet import SimAgent, SimReplica

pytestmark = pytest.mark.slow
ALPHA, BETA = "tiny-llama", "qwen-7b"  # model shards 1 and 2 of 3


def _held(*leases: AdvisoryShardLeases) -> list[set[int]]:
    return [set(lease.held) for lease in leases]


def test_control_planes_hold_a_fair_share_of_the_shards_and_take_over_a_stopped_ones(postgres_url: str) -> None:
    a, b, c = (AdvisoryShardLeases(postgres_url, 3) for _ in range(3))  # 3 model shards + the node shard
    try:
        part = a.tick(False)
        assert part is not None and part.is_whole, "alone, a control plane judges the whole fleet"
        assert b.tick(False) is None, "every shard is taken: the newcomer waits for a share"
        a.tick(False)  # two members: a hands back what is over its share
        b.tick(False)
        assert _held(a, b) == [{0, 1}, {2, 3}]
        for lease in (c, a, b, c):
            lease.tick(False)
        held = _held(a, b, c)
        assert sorted(len(h) for h in held) == [1, 1, 2], held  # four shards over three: 2, 1, 1
        assert set().union(*held) == {0, 1, 2, 3} and sum(map(len, held)) == 4, "each shard held once"
        a_pid = a._pid
        a.release()  # a control plane stops: it hands its shards back before its session ends
        with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
            left = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
                                (a_pid,)).fetchone()
        assert left == (0,), "a stopped control plane's locks are free when release returns, not when its backend exits"
        for lease in (b, c):
            lease.tick(False)
        assert set().union(*_held(b, c)) == {0, 1, 2, 3} and [len(h) for h in _held(b, c)] == [2, 2]
        # A killed backend (a host gone) loses its shards as well; the survivor takes them on its next tick.
        with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                         " AND classid = %s AND objid = %s", (0x7069_7368, min(c.held)))
        wait_until(lambda: c.tick(False) is None or (b.tick(False) is not None and len(b.held) == 4), timeout=10,
                   interval=0.05, what="the survivor to take every shard")
        wait_until(lambda: b.tick(False) is not None and len(b.held) == 4, timeout=10, interval=0.05,
                   what="the survivor to hold all four")
    finally:
        for lease in (a, b, c):
            lease.release()


def test_a_round_decides_only_under_the_guardrails_lock(postgres_url: str) -> None:
    """Decisions wait for the fleet's guardrails lock: another control plane deciding holds them back."""
    config = ServerConfig(database_url=postgres_url)
    clock = FakeClock(T0 - timedelta(minutes=30))
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        jobs: Jobs = client.app.state.jobs  # type: ignore[attr-defined]
        for stalled in [False] * 6 + [True] * 15:  # reports only: no round runs
            r0 = agent.replica("r0")
            r0.stalled, r0.canary_ok, r0.waiting = stalled, not stalled, 4 if stalled else 0
            clock.advance(10)
            agent.report(client, clock, 10)
        jobs.policies.refresh(clock())
        done: list[list[int]] = []

        def one_round() -> None:
            with session_scope(jobs._sessions) as session:
                done.append(run_round(session=session, now=clock(), policies=jobs.policies.policies,
                                      guard_config=jobs.guard_config, history=timedelta(minutes=15)).recorded)

        with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", (GUARD_LOCK_ID,))
            worker = threading.Thread(target=one_round)
            worker.start()

            def waiting() -> bool:
                row = other.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                                    " AND objid = %s", (GUARD_LOCK_ID,)).fetchone()
                return bool(row and row[0])

            wait_until(waiting, timeout=30, interval=0.05, what="the round to wait for the guardrails lock")
            assert _restarts(jobs) == {}, "nothing decided while another control plane decides"
            other.execute("SELECT pg_advisory_unlock(%s)", (GUARD_LOCK_ID,))
            worker.join(timeout=60)
        assert done and done[0], "the round decided once the lock was free"
        assert _restarts(jobs) == {"replica:gpu-a/r0": "approved"}
        jobs.stop()


def _restarts(jobs: Jobs) -> dict[str, str]:
    with session_scope(jobs._sessions) as session:
        rows = session.scalars(select(ActionRow).where(ActionRow.kind == "restart")).all()
        return {r.target: r.state for r in rows}


def test_spread_rounds_act_once_per_replica_share_the_rate_limit_and_survive_a_stop(postgres_url: str,
                                                                                 tmp_path: Path) -> None:
    assert (shard_of(ALPHA, 3), shard_of(BETA, 3)) == (1, 2)
    config = ServerConfig(database_url=postgres_url, policy_shards=3, policy_max_duty=1.0,
                          guardrails={"max_disruptive_per_window": 1})
    clock = FakeClock(T0 - timedelta(minutes=30))
    agents = [SimAgent("gpu-a", [SimReplica("a0", model=ALPHA), SimReplica("b0", model=BETA),
                                 SimReplica("a2", model=ALPHA, gpus=[1])]),
              SimAgent("gpu-b", [SimReplica("a1", model=ALPHA, gpus=[1]), SimReplica("b1", model=BETA, gpus=[1])])]
    with ExitStack() as stack:
        clients = [stack.enter_context(TestClient(create_app(config, clock=clock, run_jobs=False)))
                   for _ in range(2)]
        jobs: list[Jobs] = [c.app.state.jobs for c in clients]  # type: ignore[attr-defined]
        for j in jobs:
            stack.callback(j.stop)  # hands back the shards and the leader lock

        running, reporting = list(jobs), list(agents)
        by_whom: dict[str, int] = {}  # the control plane whose round recorded each restart

        def step(seconds: float = 10.0) -> None:
            clock.advance(seconds)
            for agent in reporting:
                agent.report(clients[0], clock, seconds)
            for j in running:
                j.elect()
                done = j.evaluate()
                with session_scope(j._sessions) as session:
                    for row in session.scalars(select(ActionRow).where(
                            ActionRow.id.in_(done.recorded if done else []), ActionRow.kind == "restart")):
                        by_whom[row.target] = jobs.index(j)

        step()
        step()
        parts = [j.rounds.part for j in jobs]
        # Three model shards and the node shard over two control planes: ALPHA's is the first's, BETA's the other's.
        assert parts == [Part.of(3, {0, 1}), Part.of(3, {2, 3})], parts
        assert [c.get("/metrics").text.count("pitstop_cp_policy_shards_held 2.0") for c in clients] == [1, 1]
        for _ in range(5):
            step()
        assert _restarts(jobs[0]) == {}
        # One replica of each model wedges: each is judged by one control plane only.
        for agent, name in ((agents[0], "a0"), (agents[1], "b1")):
            r = agent.replica(name)
            r.stalled, r.canary_ok, r.waiting = True, False, 4
        for _ in range(15):
            step()
        restarts = _restarts(jobs[0])
        # One restart per wedged replica, each recorded by the control plane that holds its model's shard; the
        # rate limit (one an hour, fleet-wide) let the first through and held the other, though another control
        # plane decided it.
        assert by_whom == {"replica:gpu-a/a0": 0, "replica:gpu-b/b1": 1}, by_whom
        assert sorted(restarts) == ["replica:gpu-a/a0", "replica:gpu-b/b1"], restarts
        assert sorted(restarts.values()) == ["approved", "suppressed"] or sorted(restarts.values()) == [
            "running", "suppressed"], restarts
        with session_scope(jobs[0]._sessions) as session:
            assert len(session.scalars(select(ActionRow).where(ActionRow.kind == "restart")).all()) == 2
        # gpu-b goes dark: the node shard's holder pages, and the other, which does not judge nodes, leaves that
        # page alone (it would resolve at once a page it does not propose, then the holder would page again).
        reporting.remove(agents[1])
        for _ in range(10):
            step()
        with session_scope(jobs[0]._sessions) as session:
            pages = session.scalars(select(AlertRow).where(AlertRow.policy == "node-unreachable")).all()
            assert [(a.labels["target"], a.state) for a in pages] == [("node:gpu-b", "firing")]
        # The first control plane stops: the other takes every shard and goes on judging both models.
        jobs[0].stop()
        running.remove(jobs[0])
        r = agents[0].replica("a2")
        r.stalled, r.canary_ok, r.waiting = True, False, 4
        for _ in range(15):
            step()
        assert jobs[1].rounds.part is not None and jobs[1].rounds.part.is_whole
        assert _restarts(jobs[1])["replica:gpu-a/a2"] == "suppressed", "judged by the survivor, held back"
