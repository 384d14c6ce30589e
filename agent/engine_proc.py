"""One engine process: spawned as an argv list in its own process group, logged to a rotated file, stopped
group-wide.

The group matters: vLLM's API server forks an EngineCore which forks workers (docs/design.md: four processes), and
a SIGTERM that reaches only the API server can leave GPU memory held by an orphaned worker. So every signal
goes to the group, and a stop ends with SIGKILL of the group after the stop deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import psutil


class RotatingLog:
    """A size-capped log file with numbered backups (``engine.log``, ``engine.log.1``, ...)."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")

    def write(self, data: bytes) -> None:
        if self._file.tell() + len(data) > self.max_bytes and self._file.tell() > 0:
            self._rotate()
        self._file.write(data)
        self._file.flush()

    def _rotate(self) -> None:
        self._file.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        for n in range(self.backups, 0, -1):
            src = self.path if n == 1 else self.path.with_name(f"{self.path.name}.{n - 1}")
            if src.exists():
                src.replace(self.path.with_name(f"{self.path.name}.{n}"))
        self._file = self.path.open("ab")

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def group_members(pgid: int) -> list[int]:
    """Living (non-zombie) processes of process group ``pgid``."""
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return out


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stream protocol of ``create_subprocess_exec``, plus a future set the moment the leader exits."""

    def __init__(self, exited: asyncio.Future[None], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self._exit_future = exited

    def process_exited(self) -> None:
        super().process_exited()
        if not self._exit_future.done():
            self._exit_future.set_result(None)


class EngineProcess:
    """A running engine: its process, its log and the last lines it wrote (for a crash's ``log_tail``)."""

    def __init__(self, proc: asyncio.subprocess.Process, log: RotatingLog, exited: asyncio.Future[None],
                 tail_lines: int = 50) -> None:
        self.proc = proc
        self._exited = exited
        self.pid = proc.pid
        self.pgid = proc.pid  # start_new_session=True: the engine leads a new session and group
        self.log = log
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self._pump = asyncio.create_task(self._copy_output(), name=f"engine-log-{self.pid}")

    @classmethod
    async def spawn(cls, argv: list[str], env: Mapping[str, str], log_path: Path, max_bytes: int,
                    backups: int) -> EngineProcess:
        """Start ``argv`` (never through a shell) in a new session with stdout+stderr going to the log."""
        log = RotatingLog(log_path, max_bytes, backups)
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(exited, loop), *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError:
            log.close()
            raise
        return cls(asyncio.subprocess.Process(transport, protocol, loop), log, exited)

    async def _copy_output(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                return
            if self.log._file.closed:
                return
            self.log.write(line)
            self.tail.append(line.decode(errors="replace").rstrip("\n"))

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def exited(self) -> int:
        """The leader's exit code, as soon as it exits.

        Not ``Process.wait()``: before Python 3.12 it also waits for the output pipe to close, and vLLM's
        EngineCore and workers inherit that pipe, so a killed API server would look alive for as long as
        its children run (found with a kill -9 of a real vLLM server)."""
        await asyncio.shield(self._exited)
        code = self.proc.returncode
        return code if code is not None else -1

    async def wait(self) -> int:
        """Wait for the leader to exit and its output to be copied; the exit code."""
        code = await self.exited()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._pump), timeout=2.0)
        return code

    async def stop(self, grace: float) -> int:
        """SIGTERM the group, SIGKILL it after ``grace`` seconds; return once the whole group is gone.

        SIGCONT follows the SIGTERM, as systemd does: a stopped process (a frozen EngineCore) leaves SIGTERM
        pending and would sit out the whole grace; woken, it can act on it. One that still does not exit is
        killed with the group at the deadline: SIGKILL ends stopped processes too."""
        _signal_group(self.pgid, signal.SIGTERM)
        _signal_group(self.pgid, signal.SIGCONT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        try:
            await asyncio.wait_for(self.exited(), timeout=max(0.0, deadline - loop.time()))
            # The leader is gone; give its children the rest of the grace to exit on their own.
            for _ in range(int(max(0.0, deadline - loop.time()) / 0.1)):
                if not group_members(self.pgid):
                    break
                await asyncio.sleep(0.1)
        except TimeoutError:
            pass
        await self.kill()
        return self.proc.returncode if self.proc.returncode is not None else -9

    async def kill(self) -> None:
        """SIGKILL whatever is left of the group and reap the leader."""
        if group_members(self.pgid):
            _signal_group(self.pgid, signal.SIGKILL)
        await self.exited()
        for _ in range(50):  # children are reaped by init; give it a moment
            if not group_members(self.pgid):
                break
            _signal_group(self.pgid, signal.SIGKILL)
            await asyncio.sleep(0.05)
        self.close()

    def close(self) -> None:
        if not self._pump.done():
            self._pump.cancel()
        self.log.close()

    def kill_now(self) -> None:
        """Synchronous last resort (interpreter exit): SIGKILL the group without waiting."""
        _signal_group(self.pgid, signal.SIGKILL)
