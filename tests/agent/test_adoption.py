"""What a restarted agent needs to adopt an engine: the pid file's record of it, and a watch on a process that is
not its child."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from agent.adopted import UNKNOWN_EXIT, AdoptedEngine
from agent.pidfile import PidFile
from tests.agent.conftest import group_alive


def _engine() -> subprocess.Popen[bytes]:
    """A stand-in engine in its own session, as the agent spawns one."""
    return subprocess.Popen([sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(60)"],
                            start_new_session=True, stdout=subprocess.DEVNULL)


def test_the_pid_file_records_what_the_engine_runs(tmp_path: Path) -> None:
    engine = _engine()
    try:
        pidfile = PidFile(tmp_path / "run" / "r1.pid")
        pidfile.write(engine.pid, 3, ["--max-num-seqs", "32"])
        left = pidfile.left()
        assert left is not None and (left.pid, left.generation, left.args) == (engine.pid, 3, ["--max-num-seqs", "32"])
        # An older agent's record has no generation: never taken for what is wanted now.
        record = json.loads(pidfile.path.read_text())
        pidfile.path.write_text(json.dumps({"pid": record["pid"], "create_time": record["create_time"]}))
        older = pidfile.left()
        assert older is not None and older.generation is None
    finally:
        engine.kill()
        engine.wait()
    assert pidfile.left() is None  # gone


def test_an_engine_announced_but_never_recorded_is_found_by_its_mark(tmp_path: Path) -> None:
    pidfile = PidFile(tmp_path / "run" / "r1.pid")
    mark = pidfile.announce(4, ["--max-num-seqs", "16"])
    assert pidfile.left() is None  # announced, never spawned: nothing to adopt
    # The engine leads its session; the child it starts inherits the mark and must not be taken for it.
    engine = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "print('serving', flush=True); time.sleep(60)"],
                              start_new_session=True, stdout=subprocess.PIPE,
                              env={**os.environ, **mark})
    try:
        assert engine.stdout is not None and engine.stdout.readline() == b"serving\n"
        left = pidfile.left()
        assert left is not None and (left.pid, left.generation, left.args) == (engine.pid, 4, ["--max-num-seqs", "16"])
        assert left.create_time == psutil.Process(engine.pid).create_time()
        # Another replica's mark finds nothing.
        assert PidFile(tmp_path / "run" / "r2.pid").announce(4, []) != mark
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()
    assert pidfile.left() is None  # gone


def test_an_adopted_engine_is_watched_and_stopped_group_wide(tmp_path: Path) -> None:
    engine = _engine()
    log = tmp_path / "logs" / "r1.log"
    log.parent.mkdir()
    log.write_text("Application startup complete\n")
    left = PidFile(tmp_path / "r1.pid")
    left.write(engine.pid, 0, [])
    record = left.left()
    assert record is not None

    async def adopt_and_stop() -> tuple[int | None, int, list[str]]:
        adopted = AdoptedEngine(record.pid, record.create_time, log, 1024 * 1024, 1, poll=0.02)
        before = adopted.returncode
        with_tail = adopted.log_tail()
        code = await adopted.stop(grace=5)
        assert (await adopted.exited()) == UNKNOWN_EXIT
        return before, code, with_tail

    try:
        before, code, tail = asyncio.run(adopt_and_stop())
        engine.wait(timeout=5)  # reaped here, as init would reap it for an agent that is not its parent
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    assert before is None and code == UNKNOWN_EXIT
    assert tail == ["Application startup complete"]
    assert group_alive(engine.pid) == []
