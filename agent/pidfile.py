"""A record of the engine each replica runs, so a restarted agent can find an engine its predecessor left.

An agent killed with SIGKILL cannot stop its engines (they run in their own sessions on purpose). The next
agent would then fail to bind the replica's port and crash-loop, or restart every engine of the node for an
agent restart. So each spawn writes ``<name>.pid``: the pid and its create time (which tells a reused pid from
the original), and the generation and engine arguments it runs, so the next agent can adopt it
(``agent.adopted``) and judge it against what is wanted.

The record is written twice. Before the spawn it announces the engine with a mark, a random token the engine
carries in its environment (``PITSTOP_ENGINE_MARK``); after the spawn it adds the pid. An agent killed between
the two leaves an engine whose pid nobody wrote down: the next agent finds it by its mark, the session leader
whose environment carries it, so no engine ever runs without a record that leads to it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENGINE_MARK = "PITSTOP_ENGINE_MARK"


class Leftover(BaseModel):
    """An engine a previous agent started: what it is, and what it was started to run."""

    model_config = ConfigDict(frozen=True)

    pid: int
    create_time: float
    # None: written by an agent that did not record them; such an engine is never what is wanted now.
    generation: int | None = None
    args: list[str] = Field(default_factory=list)


class _Record(BaseModel):
    """The file: an announced engine has a mark and no pid yet."""

    pid: int | None = None
    create_time: float | None = None
    generation: int | None = None
    args: list[str] = Field(default_factory=list)
    mark: str | None = None


def find_marked(mark: str) -> psutil.Process | None:
    """The live session leader whose environment carries ``mark``: the engine, not a child that inherited it."""
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.info["status"] == psutil.STATUS_ZOMBIE or os.getsid(proc.pid) != proc.pid:
                continue
            if proc.environ().get(ENGINE_MARK) == mark:
                return proc
    return None


class PidFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._mark: str | None = None  # the engine announced last: its pid's record keeps the mark

    def announce(self, generation: int | None, args: list[str]) -> dict[str, str]:
        """Record the engine about to be spawned; the environment entry that marks it, for the spawn."""
        self._mark = secrets.token_hex(16)
        self._save(_Record(generation=generation, args=list(args), mark=self._mark))
        return {ENGINE_MARK: self._mark}

    def write(self, pid: int, generation: int | None = None, args: list[str] | None = None) -> None:
        """Record the spawned engine, with the mark ``announce`` gave it."""
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            created = 0.0
        self._save(_Record(pid=pid, create_time=created, generation=generation, args=list(args or []),
                           mark=self._mark))

    def _save(self, record: _Record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(record.model_dump_json(exclude_none=True))
        os.replace(tmp, self.path)  # a kill between the two leaves the old record or the new one, never half

    def clear(self) -> None:
        self._mark = None
        self.path.unlink(missing_ok=True)

    def leftover(self) -> int | None:
        """The pid of a recorded engine that is still the same process, else ``None``."""
        left = self.left()
        return None if left is None else left.pid

    def left(self) -> Leftover | None:
        """The recorded engine, if it is still the same process (not a zombie), else ``None``."""
        try:
            record = _Record.model_validate_json(self.path.read_text())
            if record.pid is None:  # announced, and the agent was gone before it wrote the pid
                marked = find_marked(record.mark) if record.mark else None
                if marked is None:
                    return None
                record = record.model_copy(update={"pid": marked.pid, "create_time": marked.create_time()})
                self._save(record)  # found by its mark: written down now
            proc = psutil.Process(record.pid)
            if record.create_time is not None and proc.create_time() == record.create_time \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                return Leftover(pid=proc.pid, create_time=record.create_time, generation=record.generation,
                                args=record.args)
        except (OSError, ValidationError, psutil.Error):
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
