"""An engine's log is size-capped and rotated; its pid file tells a leftover engine from a reused pid."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.engine_proc import RotatingLog
from agent.pidfile import PidFile


def test_log_rotates_at_the_cap_and_keeps_n_backups(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "r1.log"
    log = RotatingLog(path, max_bytes=100, backups=2)
    for n in range(10):
        log.write(f"line {n:02d} ".encode() * 5 + b"\n")  # 41 bytes a line
    log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["r1.log", "r1.log.1", "r1.log.2"]
    assert all(p.stat().st_size <= 100 for p in path.parent.iterdir())
    assert path.read_text().endswith("line 09 \n")  # the newest lines are in the live file
    assert "line 00" not in "".join(p.read_text() for p in path.parent.iterdir())  # the oldest were dropped


def test_pid_file_recognises_the_same_process_only(tmp_path: Path) -> None:
    pidfile = PidFile(tmp_path / "run" / "r1.pid")
    assert pidfile.leftover() is None
    pidfile.write(os.getpid())
    assert pidfile.leftover() == os.getpid()
    # Same pid, different create time: the pid was reused by an unrelated process; leave it alone.
    data = json.loads(pidfile.path.read_text())
    pidfile.path.write_text(json.dumps({**data, "create_time": data["create_time"] - 1000}))
    assert pidfile.leftover() is None
    pidfile.clear()
    assert not pidfile.path.exists()
