"""A policy with ``for: 5s`` acts 5 s after the first crossing sample, not at whichever report or interval follows."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.jobs import Jobs
from tests.controlplane.fixtures import T0, FakeClock
from tests.helpers import wait_until
from tests.remediation.fleet import SimAgent, SimReplica, fleet, server_config
from tests.remediation.test_guarded_flows import policy_dir

TTFT = """name: ttft-slo
condition: {signal: ttft_p99_seconds, op: ">", threshold: 0.5, for: 5s}
action: {kind: alert, severity: warning}
"""


def alerts(client: TestClient) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = client.get("/v1/actions", params={"policy": "ttft-slo"}).json()
    return rows


def test_the_round_after_a_crossing_knows_when_the_for_completes(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0")])
    policies = policy_dir(tmp_path, ttft=TTFT)
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)], policy_defaults=False) as f:
        f.run(10, every=1.0)
        assert f.jobs.last_round is not None and f.jobs.last_round.next_due is None  # nothing under way
        agent.replica("r0").ttft = 0.9
        f.step(1.0)  # the first crossing sample
        crossed = f.clock()
        f.run(4, every=1.0)
        assert f.jobs.last_round is not None and f.jobs.last_round.next_due == crossed + timedelta(seconds=5)
        assert alerts(f.client) == []
        f.clock.advance(1.0)  # no report in between: the round at the moment acts on the samples it has
        f.jobs.evaluate()
        [alert] = alerts(f.client)
        assert datetime.fromisoformat(str(alert["created_at"])) == crossed + timedelta(seconds=5)


def test_a_round_is_booked_for_the_moment_and_fires_with_no_report_and_no_interval(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0")])
    policies = policy_dir(tmp_path, ttft=TTFT)
    clock = FakeClock(T0)
    # Rounds come an hour apart, and an hour after a report: only a booked round can fire below.
    config = server_config(tmp_path, policy_dirs=[str(policies)], policy_defaults=False,
                           policy_interval_seconds=3600, policy_debounce_seconds=3600,
                           executor_interval_seconds=3600)
    with TestClient(create_app(config, clock=clock)) as client:
        jobs: Jobs = client.app.state.jobs  # type: ignore[attr-defined]
        for _ in range(10):
            clock.advance(1)
            agent.report(client, clock, 1)
        agent.replica("r0").ttft = 0.9
        crossed = clock() + timedelta(seconds=1)
        for _ in range(5):  # the first crossing sample and four more
            clock.advance(1)
            agent.report(client, clock, 1)
        due = crossed + timedelta(seconds=5)

        def a_round_saw_it() -> bool:
            result = jobs.evaluate()  # None while the start-up round still runs
            return result is not None and result.next_due == due

        wait_until(a_round_saw_it, timeout=10, what="a round over the crossing reports")
        assert alerts(client) == []
        clock.advance(1)  # the moment comes; no report, no interval
        wait_until(lambda: bool(alerts(client)), timeout=10, what="the alert from the booked round")
        [alert] = alerts(client)
        assert datetime.fromisoformat(str(alert["created_at"])) == due
