"""``pitstop server``'s policy process: rounds run beside the API process, act on reports, and end with it."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agent.wire import ReplicaState
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # starts a second interpreter


def _round_count(client: TestClient) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("pitstop_cp_policy_round_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def _sample(client: TestClient, series: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_rounds_run_in_their_own_process_and_act_on_reports(tmp_path: Path) -> None:
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'pitstop.db'}", policy_interval_seconds=0.5,
                          policy_debounce_seconds=0.2, leader_poll_seconds=0.5)
    app = create_app(config, policy_process=True)
    with TestClient(app) as client:
        process = app.state.jobs.process
        assert process is not None and process.alive()
        assert process._process.pid != os.getpid()
        fatal = replica("r0", state=ReplicaState.FATAL, restarts=5)
        now = datetime.now(UTC)
        assert client.post("/v1/agents/gpu-a/report", json=body(report(sequence=1, sent_at=now, replicas=[fatal])),
                           ).status_code == 200
        # The crash-loop policy pages: recorded by the policy process, read back through this one's API.
        wait_until(lambda: any(a["policy"] == "crash-loop" for a in client.get("/v1/actions").json()), 20,
                   what="the policy process to record the crash-loop page")
        # Each round's duration reaches this process's /metrics, and so do the actions its rounds finished.
        wait_until(lambda: _round_count(client) > 0, 10, what="round durations on /metrics")
        wait_until(lambda: _sample(client, 'pitstop_cp_actions_total{kind="alert",outcome="succeeded"}') >= 1, 10,
                   what="the finished page on /metrics")
    # The app's shutdown ends the policy process.
    deadline = time.monotonic() + 10
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process.alive()
