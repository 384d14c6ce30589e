"""A warm standby: a second control plane follows the sample history and takes over when the leader goes."""

from __future__ import annotations

import subprocess
import sys
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.leader import FileLockLeadership, leadership_for
from tests.controlplane.fixtures import T0, FakeClock, body, gpu, replica, report
from tests.helpers import wait_until

POLL = 0.2


def _leads(client: TestClient) -> bool:
    return bool(client.app.state.pitstop.leadership.is_leader)  # type: ignore[attr-defined]


def _series(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not served")


def test_one_sqlite_database_has_one_leader_until_its_process_dies(tmp_path: Path) -> None:
    lock = tmp_path / "cp.db.leader"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)"), str(lock)],
        stdout=subprocess.PIPE, text=True)
    ours = leadership_for(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        assert isinstance(ours, FileLockLeadership)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert not ours.tick() and not ours.is_leader
        holder.kill()  # SIGKILL: no clean-up runs, the kernel drops the lock with the process
        holder.wait()
        assert ours.tick() and ours.is_leader
        other = FileLockLeadership(lock)
        assert not other.tick()
        ours.release()
        assert other.tick()
        other.release()
    finally:
        holder.kill()
        holder.wait()
        ours.release()


def test_a_standby_follows_the_history_and_leads_when_the_leader_stops(db_url: str, clock: FakeClock) -> None:
    # SQLite: the lock file beside the database; PostgreSQL: the advisory lock.
    config = ServerConfig(database_url=db_url, leader_poll_seconds=POLL,
                          policy_interval_seconds=POLL, executor_interval_seconds=POLL, policy_history_seconds=600)
    with ExitStack() as stack:
        a = stack.enter_context(TestClient(create_app(config, clock=clock)))
        b = stack.enter_context(TestClient(create_app(config, clock=clock)))
        assert (_leads(a), _leads(b)) == (True, False)
        assert _series(b, "pitstop_cp_leader_since_timestamp_seconds") == 0
        # Either control plane stores reports; the standby reads them into its history without evaluating.
        for i in range(3):
            sent = T0 + timedelta(seconds=10 * i)
            answer = (a if i % 2 else b).post("/v1/agents/gpu-a/report", json=body(report(
                sequence=i + 1, sent_at=sent, replicas=[replica("r0")], gpus=[gpu(0)])))
            assert answer.status_code == 200
        clock.now = T0 + timedelta(seconds=25)
        standby = b.app.state.jobs.rounds  # type: ignore[attr-defined]
        wait_until(lambda: len(standby.samples) == 6, timeout=10, what="the standby to follow three reports")
        assert standby.last_round is None
        assert _series(b, "pitstop_cp_policy_history_samples") == 6
        a.__exit__(None, None, None)  # the leader stops: its lock file is released
        wait_until(lambda: _leads(b), timeout=POLL * 20, what="the standby to take over")
        assert _series(b, "pitstop_cp_leader_since_timestamp_seconds") == clock.now.timestamp()
        wait_until(lambda: standby.last_round is not None, timeout=10, what="the new leader's first round")
        assert _series(b, "pitstop_cp_policy_round_end_timestamp_seconds") == clock.now.timestamp()
        assert len(standby.samples) == 6  # what it followed, not read twice


def test_a_report_while_the_database_is_away_is_answered_503_with_retry_after(tmp_path: Path,
                                                                               clock: FakeClock) -> None:
    db = tmp_path / "gone" / "cp.db"
    app = create_app(ServerConfig(database_url=f"sqlite:///{db}"), clock=clock, run_jobs=False)
    with TestClient(app) as c:
        for f in db.parent.iterdir():
            f.unlink()
        db.parent.rmdir()
        app.state.pitstop.engine.dispose()
        answer = c.post("/v1/agents/gpu-a/report", json=body(report()))
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "5"
        assert 'pitstop_cp_reports_rejected_total{reason="database_unavailable"} 1.0' in c.get("/metrics").text
