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
        await _until(lambda: "core up" in proc.tail)
        child = int(next(line for line in proc.tail if line.startswith("child")).split()[1])
        os.kill(child, signal.SIGSTOP)
        await _until(lambda: psutil.Process(child).status() == psutil.STATUS_STOPPED)
        started = time.monotonic()
        await proc.stop(grace=2.0)
        return time.monotonic() - started, group_members(proc.pgid), child

    took, left, child = asyncio.run(run())
    assert left == [], f"processes of the group survived the stop: {left}"
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert took < 2.0 + 3.0  # the grace, then SIGKILL and the reaping: bounded, not the child's 600 s
