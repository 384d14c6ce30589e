"""A record of the engine each replica runs, so a restarted agent can find an engine its predecessor left.

An agent killed with SIGKILL cannot stop its engines (they run in their own sessions on purpose). The next
agent would then fail to bind the replica's port and crash-loop, or restart every engine of the node for an
agent restart. So each spawn writes ``<name>.pid``: the pid and its create time (which tells a reused pid from
the original), and the generation and engine arguments it runs, so the next agent can adopt it
(``agent.adopted``) and judge it against what is wanted.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Leftover(BaseModel):
    """An engine a previous agent started: what it is, and what it was started to run."""

    model_config = ConfigDict(frozen=True)

    pid: int
    create_time: float
    # None: written by an agent that did not record them; such an engine is never what is wanted now.
    generation: int | None = None
    args: list[str] = Field(default_factory=list)


class PidFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, pid: int, generation: int | None = None, args: list[str] | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            created = 0.0
        record = Leftover(pid=pid, create_time=created, generation=generation, args=list(args or []))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(record.model_dump_json())
        os.replace(tmp, self.path)  # a kill between the two leaves the old record or the new one, never half

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def leftover(self) -> int | None:
        """The pid of a recorded engine that is still the same process, else ``None``."""
        left = self.left()
        return None if left is None else left.pid

    def left(self) -> Leftover | None:
        """The recorded engine, if it is still the same process (not a zombie), else ``None``."""
        try:
            record = Leftover.model_validate_json(self.path.read_text())
            proc = psutil.Process(record.pid)
            if proc.create_time() == record.create_time and proc.status() != psutil.STATUS_ZOMBIE:
                return record
        except (OSError, ValidationError, psutil.NoSuchProcess, psutil.AccessDenied):
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
