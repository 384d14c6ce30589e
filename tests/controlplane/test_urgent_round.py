"""An urgent round: a replica's change of state, stored while a round ran, is judged right after it, reading what is
new of that node alone; the next whole round reads the rest, each sample once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agent.wire import ReplicaEvent, ReplicaState
from controlplane.api.app import create_app
from controlplane.remediation.snapshot import build_snapshot
from controlplane.rounds import PolicyRounds
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import T0, FakeClock
from tests.remediation.fleet import SimAgent, SimReplica, server_config
from tests.remediation.test_guarded_flows import STALL, policy_dir


@dataclass
class Setup:
    client: TestClient
    clock: FakeClock
    rounds: PolicyRounds
    wedging: SimAgent  # gpu-a: r0's engine makes no progress, idle (no verdict yet)
    other: SimAgent  # gpu-b: healthy

    def report(self, *agents: SimAgent) -> None:
        for agent in agents:
            agent.report(self.client, self.clock, 10)

    def histories(self, **build: Any) -> dict[str, list[Any]]:
        with session_scope(self.client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
            snap = build_snapshot(session=session, now=self.clock(), history=timedelta(minutes=15), **build)
        return {r.key: [(s.at, s.generation_tokens_total) for s in r.history] for r in snap.replicas}


@pytest.fixture
def setup(tmp_path: Path, db_url: str) -> Iterator[Setup]:
    wedging = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    wedging.replica("r0").stalled = True  # idle: no token, nothing queued, canary fine (not a stall by itself)
    other = SimAgent("gpu-b", [SimReplica("r0")])
    config = server_config(tmp_path, database_url=db_url, policy_defaults=False, policy_history_seconds=900,
                           policy_dirs=[str(policy_dir(tmp_path, stall=STALL % ""))])
    clock = FakeClock(T0)
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        rounds = PolicyRounds(sessions=client.app.state.pitstop.sessions,  # type: ignore[attr-defined]
                              config=config, clock=clock)
        yield Setup(client, clock, rounds, wedging, other)


def _wedge(setup: Setup) -> None:
    r0 = setup.wedging.replica("r0")
    r0.state = ReplicaState.WEDGED
    setup.wedging.events.append(ReplicaEvent(replica="r0", at=setup.clock(), kind="transition",
                                             from_state=ReplicaState.READY, to_state=ReplicaState.WEDGED))


def test_a_verdict_stored_after_a_round_read_is_acted_on_by_an_urgent_round_of_its_node(setup: Setup) -> None:
    for _ in range(5):  # 40 s of an idle engine: nothing to act on
        setup.clock.advance(10)
        setup.report(setup.wedging, setup.other)
    assert setup.rounds.run_urgent() is None  # no round has read the store yet
    done = setup.rounds.run()
    assert done is not None and done[0] is not None and not done[0].recorded
    assert setup.rounds.run_urgent() is None  # no state changed since that round's read

    # While that round ran (it read the store before these): the agent's verdict, and news from another node.
    setup.clock.advance(10)
    _wedge(setup)
    setup.report(setup.wedging, setup.other)
    urgent = setup.rounds.run_urgent()
    assert urgent is not None and len(urgent[0].recorded) == 1
    assert setup.rounds.rows.read_nodes == 1  # gpu-a's rows alone
    assert setup.rounds.last_round is done[0]  # the last whole round's, as the console and status show it
    actions = setup.client.get("/v1/actions", params={"policy": "stall"}).json()
    assert [(a["kind"], a["target"]) for a in actions] == [("restart", "replica:gpu-a/r0")]
    # gpu-b's news waits for the next whole round: its history is as the round before read it.
    read = setup.histories(samples=setup.rounds.samples, rows=setup.rounds.rows, only=set())
    stored = setup.histories()
    assert read["gpu-a/r0"] == stored["gpu-a/r0"] and len(read["gpu-b/r0"]) == len(stored["gpu-b/r0"]) - 1
    assert setup.rounds.run_urgent() is None  # that change is judged: nothing new

    done = setup.rounds.run()  # reads gpu-b, and gpu-a's rows not again: each sample lands once
    assert done is not None and done[0] is not None and not done[0].recorded
    assert setup.rounds.rows.read_nodes == 1
    assert setup.histories(samples=setup.rounds.samples, rows=setup.rounds.rows, only=set()) == stored


def test_an_urgent_round_waits_for_a_round_to_have_read_the_store_after_a_new_term(setup: Setup) -> None:
    setup.clock.advance(10)
    setup.report(setup.wedging, setup.other)
    assert setup.rounds.run() is not None
    setup.rounds.forget()  # another control plane led meanwhile: the next round reads the window afresh
    setup.clock.advance(10)
    _wedge(setup)
    setup.report(setup.wedging)
    assert setup.rounds.run_urgent() is None
    done = setup.rounds.run()
    assert done is not None and done[0] is not None and len(done[0].recorded) == 1


SLOW = """name: slow
condition: {signal: ttft_p99_seconds, op: ">", threshold: 1.0, for: 30s}
action: {kind: alert, severity: warning}
"""


@pytest.mark.parametrize("recovered", [False, True])
def test_a_for_that_completes_while_a_round_runs_is_judged_on_its_nodes_news_right_after(
        tmp_path: Path, db_url: str, recovered: bool) -> None:
    slow, other = SimAgent("gpu-a", [SimReplica("r0")]), SimAgent("gpu-b", [SimReplica("r0")])
    config = server_config(tmp_path, database_url=db_url, policy_defaults=False, policy_history_seconds=900,
                           policy_dirs=[str(policy_dir(tmp_path, slow=SLOW))])
    clock = FakeClock(T0)
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        rounds = PolicyRounds(sessions=client.app.state.pitstop.sessions,  # type: ignore[attr-defined]
                              config=config, clock=clock)
        for t in (10, 20, 30, 40, 50):
            clock.now = T0 + timedelta(seconds=t)
            slow.replica("r0").ttft = 2.0 if t >= 30 else 0.1  # crossed at 30 s: met at 60 s if it goes on
            slow.report(client, clock, 10)
            other.report(client, clock, 10)
        done = rounds.run()
        assert done is not None and done[0] is not None and not done[0].recorded
        assert done[0].dues == [(T0 + timedelta(seconds=60), "gpu-a")]
        # While that round ran, the moment came, and both nodes reported again.
        clock.now = T0 + timedelta(seconds=60)
        slow.replica("r0").ttft = 0.1 if recovered else 2.0
        slow.report(client, clock, 10)
        other.report(client, clock, 10)
        clock.now = T0 + timedelta(seconds=61)
        urgent = rounds.run_urgent()
        assert urgent is not None and rounds.rows.read_nodes == 1  # gpu-a's news alone
        # Judged on what gpu-a reported since, as a whole round would: an alert only if the breach went on.
        assert len(urgent[0].recorded) == (0 if recovered else 1)
        assert rounds.run_urgent() is None  # the moments are that round's, used once
