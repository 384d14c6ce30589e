"""A record of the engine each replica runs, so a restarted agent can find an engine its predecessor left.

An agent killed with SIGKILL cannot stop its engines (they run in their own sessions on purpose). The next
agent would then fail to bind the replica's port and crash-loop. So each spawn writes ``<name>.pid`` (pid and
process create time, which tells a reused pid from the original) and the next start first ends that group.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil


class PidFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, pid: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            created = 0.0
        self.path.write_text(json.dumps({"pid": pid, "create_time": created}))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def leftover(self) -> int | None:
        """The pid of a recorded engine that is still the same process, else ``None``."""
        try:
            data = json.loads(self.path.read_text())
            pid, created = int(data["pid"]), float(data["create_time"])
            if psutil.Process(pid).create_time() == created:
                return pid
        except (OSError, ValueError, KeyError, TypeError, psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        return None


def end_group(pgid: int, grace: float, sleep: float = 0.1) -> None:
    """SIGTERM the group, SIGKILL it after ``grace``; runs before any engine is started, so it may block."""
    try:
        os.killpg(pgid, signal.SIGTERM)
        os.killpg(pgid, signal.SIGCONT)  # a stopped member leaves SIGTERM pending (``EngineProcess.stop``)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)
            time.sleep(sleep)
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
