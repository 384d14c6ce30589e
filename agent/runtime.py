"""What starts, stops, kills, waits for, reads and finds a replica's engine: the runtime seam (docs/design.md,
"Runtimes").

The supervisor (``agent.supervisor``) drives one state machine whatever runs the engine. Two runtimes stand behind
this seam: ``process`` (the default: the engine is a child process in a session of its own, ``agent.engine_proc``)
and ``container`` (the engine runs in a Docker or Podman container, ``agent.containers``). Each gives the
supervisor the same few things:

- ``start``: a running ``Engine``, or ``StartRefused`` with a reason a person can act on;
- ``take_over``: the engine a previous agent left for this replica, with the generation and arguments it runs;
- ``end_leftovers``: end what a previous agent left and this one does not adopt;
- ``forget``: the running engine is gone; its record goes too.

An ``Engine`` has a host pid (what the readings, the stack dump and the connection count read), and is waited
for, stopped and killed the same way in both.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.adopted import AdoptedEngine
from agent.engine_log import last_lines
from agent.engine_proc import EngineProcess, Exits
from agent.pidfile import PidFile, end_group


class Engine(Exits, Protocol):
    """A running engine, however it was started: how it exits (``Exits``), and how it is stopped and read."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int: ...

    async def stop(self, grace: float) -> int: ...

    async def kill(self) -> None: ...

    async def last_words(self) -> list[str]:
        """The engine's last lines of output, for the replica's ``log_tail``."""
        ...


class StartRefused(Exception):
    """The engine could not be started; the message says why, for the replica's state and the agent's log."""


@dataclass(frozen=True)
class Found:
    """An engine a previous agent started and left running."""

    engine: Engine
    generation: int
    args: list[str]
    what: str  # how the replica's events name it: "engine 1234", "container pitstop-n1-r0-3"


@dataclass(frozen=True)
class Ended:
    """What ``end_leftovers`` ended: named for the event, with its last lines."""

    what: str
    last_words: list[str]


class Runtime(Protocol):
    def environment(self, own: Mapping[str, str]) -> dict[str, str]:
        """The engine's environment: what the runtime gives every engine, then ``own``."""
        ...

    async def start(self, argv: list[str], env: Mapping[str, str], generation: int,
                    args: list[str]) -> Engine: ...

    async def take_over(self) -> Found | None: ...

    async def end_leftovers(self, grace: float) -> list[Ended]: ...

    def forget(self) -> None: ...


class ProcessRuntime:
    """Engines as child processes of the agent, each in a session of its own, found again through a pid file."""

    def __init__(self, name: str, state_dir: Path, log_max_bytes: int, log_backups: int) -> None:
        self.log_path = state_dir / "logs" / f"{name}.log"
        self.pidfile = PidFile(state_dir / "run" / f"{name}.pid")
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self._adopted: int | None = None  # the pid ``take_over`` handed out: not a leftover to end

    def environment(self, own: Mapping[str, str]) -> dict[str, str]:
        return {**os.environ, **own}  # a child inherits the agent's environment

    async def start(self, argv: list[str], env: Mapping[str, str], generation: int,
                    args: list[str]) -> Engine:
        full = {**env, **self.pidfile.announce(generation, args)}
        try:
            proc = await EngineProcess.spawn(argv, full, self.log_path, self.log_max_bytes, self.log_backups)
        except OSError as exc:
            self.pidfile.clear()
            raise StartRefused(f"cannot start {argv[0]!r}: {exc}") from exc
        self.pidfile.write(proc.pid, generation, args)
        return proc

    async def take_over(self) -> Found | None:
        left = self.pidfile.left()
        if left is None or left.generation is None:  # an older agent's record, with no generation: not adopted
            return None
        self._adopted = left.pid
        engine = AdoptedEngine(left.pid, left.create_time, self.log_path, self.log_max_bytes, self.log_backups)
        return Found(engine, left.generation, list(left.args), f"engine {left.pid}")

    async def end_leftovers(self, grace: float) -> list[Ended]:
        if self._adopted is not None:
            return []
        pid = self.pidfile.leftover()
        ended = []
        if pid is not None:
            await asyncio.to_thread(end_group, pid, grace)
            # Its last lines, as its log file holds them, are the report's (``agent.engine_log``).
            ended.append(Ended(f"engine {pid}", last_lines(self.log_path)))
        self.pidfile.clear()
        return ended

    def forget(self) -> None:
        self._adopted = None
        self.pidfile.clear()
