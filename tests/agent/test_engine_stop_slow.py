"""The stop path against a frozen engine: SIGTERM stays pending on a stopped process, so only the group-wide
SIGKILL at the stop deadline ends it. Real processes: a leader like vLLM's API server and a child that plays a
wedged EngineCore (it ignores SIGTERM and is frozen with SIGSTOP)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from agent.engine_proc import EngineProcess, group_members

pytestmark = pytest.mark.slow

# The leader exits on SIGTERM as vLLM's API server does; its child ignores SIGTERM, then is frozen.
LEADER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('core up', flush=True); "
    "time.sleep(600)"])
print('child', child.pid, flush=True)
time.sleep(600)
"""


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(20):
        while not predicate():  # noqa: ASYNC110 - another process's state: nothing to wait on but a poll
            await asyncio.sleep(0.05)


def test_a_frozen_child_that_ignores_sigterm_is_killed_by_the_stop_deadline(tmp_path: Path) -> None:
    async def run() -> tuple[float, list[int], int]:
        proc = await EngineProcess.spawn([sys.executable, "-c", LEADER], dict(os.environ), tmp_path / "e.log",
                                         1 << 20, 1)
        await _until(lambda: "core up" in proc.log_tail())
        child = int(next(line for line in proc.log_tail() if line.startswith("child")).split()[1])
        os.kill(child, signal.SIGSTOP)
        await _until(lambda: psutil.Process(child).status() == psutil.STATUS_STOPPED)
        started = time.monotonic()
        await proc.stop(grace=2.0)
        return time.monotonic() - started, group_members(proc.pgid), child

    took, left, child = asyncio.run(run())
    assert left == [], f"processes of the group survived the stop: {left}"
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert took < 2.0 + 3.0  # the grace, then SIGKILL and the reaping: bounded, not the child's 600 s


# Writes numbered lines to stdout and stderr, without flushing anything through a pipe: the file is its output.
CHATTY = """
import sys, time
for n in range(100000):
    print(f"out {n:06d}", flush=True)
    print(f"err {n:06d}", file=sys.stderr, flush=True)
    time.sleep(0.001)
"""


def test_an_engine_writes_its_own_log_file_and_it_rotates_while_it_writes(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "e.log"

    async def run() -> list[str]:
        proc = await EngineProcess.spawn([sys.executable, "-c", CHATTY], dict(os.environ), log, 4096, 2,
                                         log_check_interval=0.05)
        try:
            assert os.readlink(f"/proc/{proc.pid}/fd/1") == os.readlink(f"/proc/{proc.pid}/fd/2") == str(log)
            await _until(lambda: (tmp_path / "logs" / "e.log.2").exists())
            return proc.log_tail()
        finally:
            await proc.stop(grace=2.0)

    tail = asyncio.run(run())
    assert {line.split()[0] for line in tail} == {"out", "err"}  # stdout and stderr both
    numbers = [int(line.split()[1]) for line in tail if line.startswith("out")]
    assert numbers == sorted(numbers) and len(numbers) > 5  # the newest lines, in order
    # Truncated in place (O_APPEND): the engine's writes after a rotation start the file, no hole of zeros.
    assert b"\0" not in log.read_bytes()
    assert sorted(p.name for p in log.parent.iterdir()) == ["e.log", "e.log.1", "e.log.2"]
