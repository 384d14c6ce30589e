"""One demo per state dir: ``<state-dir>/demo.lock``, held with ``flock`` for the demo's lifetime, its pid in it.

The kernel drops a ``flock`` the moment its holder dies, SIGKILL included, so the lock cannot go stale: a lock
that is held means a demo is running, and the pid in the file is that demo's. The file is opened close-on-exec
(Python's default) and the demo's children get no inherited descriptors, so no leftover process can hold it
after the demo is gone; what such a process still runs is found by its mark instead (``demo_procs``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOCK = "demo.lock"


@dataclass
class DemoLock:
    """This process holds the state dir's lock while the file stays open."""

    path: Path
    file: IO[str]

    def release(self) -> None:
        self.file.close()


def acquire(state: Path) -> DemoLock | None:
    """The lock, with this process's pid written in it; None while another process holds it."""
    state.mkdir(parents=True, exist_ok=True)
    path = state / LOCK
    file = path.open("a+")  # never truncated before it is ours: the holder's pid stays readable
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        return None
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    return DemoLock(path, file)


def holder(state: Path, wait: float = 2.0) -> int | None:
    """The pid of the demo holding the lock: written right after it took the lock, so allow it ``wait``
    seconds; None when it cannot be read."""
    deadline = time.monotonic() + wait
    while True:
        with contextlib.suppress(OSError, ValueError):
            return int((state / LOCK).read_text().strip())
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def describe(state: Path, pid: int | None) -> str:
    """What a second demo says about the running one: its pid and, once it is up, its URLs."""
    who = f"pid {pid}" if pid is not None else "pid unknown"
    lines = [f"pitstop demo: another demo is running with this state dir ({state}): {who}"]
    try:
        urls = json.loads((state / "demo.json").read_text())
    except (OSError, ValueError):
        urls = None
    if isinstance(urls, dict) and urls.get("pid") == pid:
        for key, label in (("console", "console"), ("api", "control plane"), ("agent", "agent"),
                           ("prometheus", "Prometheus"), ("alertmanager", "Alertmanager")):
            if urls.get(key):
                lines.append(f"  {label:<14} {urls[key]}")
        lines += [f"  replica        {url}" for url in urls.get("replicas") or []]
    else:
        lines.append("  (still starting: its URLs are not written yet)")
    lines.append("Stop it (Ctrl-C where it runs" + (f", or kill {pid}" if pid is not None else "") +
                 "), or run pitstop demo --replace to stop it and start a new one.")
    return "\n".join(lines)


def take_over(state: Path, grace: float = 30.0) -> DemoLock | None:
    """Stop the demo holding the lock (SIGTERM; SIGKILL if it still holds it after ``grace`` seconds) and take
    the lock; None when that demo cannot be stopped (another user's, say)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        lock = acquire(state)
        if lock is not None:
            return lock
        pid = holder(state)
        if pid is None:
            return None
        # The lock is held, so the pid in the file is its live holder's: no stale pid to hit by mistake.
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # gone between the two reads: the lock is free now
        except PermissionError:
            return None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            lock = acquire(state)
            if lock is not None:
                return lock
            time.sleep(0.2)
    return None
