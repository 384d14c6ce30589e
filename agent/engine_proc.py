"""One engine process: spawned as an argv list in its own process group, writing its own rotated log file
(``agent.engine_log``), stopped group-wide.

The group matters: vLLM's API server forks an EngineCore which forks workers (docs/design.md: four processes), and
a SIGTERM that reaches only the API server can leave GPU memory held by an orphaned worker. So every signal
goes to the group, and a stop ends with SIGKILL of the group after the stop deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import psutil

from agent.engine_log import EngineLog, open_for_engine
from agent.ticks import until_tick

log = logging.getLogger(__name__)
# Seconds between looks at the log's size: a stat each, every engine's on the same tick (one wakeup, that of the
# collector at the default scrape interval); at 5 s an engine logging 1 MB/s passes its cap (``log_max_bytes``,
# 10 MiB) by at most 5 MB before it rotates.
LOG_CHECK_INTERVAL = 5.0
# How long a failure waits for the exit of an engine already gone but not yet reaped (``reap_if_dead``).
REAP_GRACE_SECONDS = 1.0


class Exits(Protocol):
    """What ``reap_if_dead`` and ``with_exit`` need of an engine: ``EngineProcess`` and
    ``agent.adopted.AdoptedEngine``."""

    @property
    def returncode(self) -> int | None: ...

    @property
    def gone(self) -> bool: ...

    @property
    def how_it_ended(self) -> str: ...

    async def exited(self) -> int: ...


async def reap_if_dead(proc: Exits, grace: float = REAP_GRACE_SECONDS) -> bool:
    """Whether ``proc`` has exited of itself. A dying engine refuses requests a moment before the loop reaps its
    exit: one gone but not yet reaped is waited for, ``grace`` seconds at most, so its exit code is known."""
    if proc.returncode is None and proc.gone:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.exited(), grace)
    return proc.returncode is not None


def with_exit(reason: str, proc: Exits) -> str:
    """``reason`` for a failure of an engine that ended of itself, with how it ended."""
    how = proc.how_it_ended
    return f"{reason} ({how})" if "exited" in reason else f"{reason}; the engine had exited ({how})"


def describe_exit(code: int) -> str:
    """An exit code as a person reads it: a negative one names the signal that ended the process (-9: SIGKILL,
    which the kernel's OOM killer sends)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


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


def process_gone(pid: int, created: float | None = None) -> bool:
    """Whether process ``pid`` has exited: no such process, a zombie not yet reaped, or (``created`` given)
    another process under a reused pid. One not ours to read counts as alive."""
    try:
        proc = psutil.Process(pid)
        return (created is not None and proc.create_time() != created) or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


async def pid_exit(pid: int, created: float | None, poll: float = 0.2) -> None:
    """Return once process ``pid``, not the agent's child, has exited: an engine in a container (conmon's or the
    shim's child) or one a previous agent left (``agent.adopted``). No wait() reports such an exit: a pidfd does,
    readable in the event loop the moment the process exits, with no polling (eight engines polled five times a
    second cost the agent four times its CPU). Where pidfds are missing (Linux before 5.3), the pid is polled every
    ``poll`` seconds. ``created`` tells a reused pid from the process meant."""
    if not pid:
        return
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        while not process_gone(pid, created):  # noqa: ASYNC110 - nothing to wait on without a pidfd
            await asyncio.sleep(poll)
        return
    try:
        if process_gone(pid, created):  # exited, or the pid reused, before the pidfd was opened
            return
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)
        loop.add_reader(fd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def kill_group(pgid: int, leader_gone: Callable[[], Awaitable[object]]) -> None:
    """SIGKILL whatever is left of group ``pgid``, wait for its leader, then for the rest: children are
    reaped by init, which takes a moment."""
    if group_members(pgid):
        signal_group(pgid, signal.SIGKILL)
    await leader_gone()
    for _ in range(50):
        if not group_members(pgid):
            break
        signal_group(pgid, signal.SIGKILL)
        await asyncio.sleep(0.05)


class EngineProcess:
    """A running engine: its process, and its log (the file it writes, and the last lines for a ``log_tail``)."""

    def __init__(self, proc: asyncio.subprocess.Process, engine_log: EngineLog,
                 log_check_interval: float = LOG_CHECK_INTERVAL) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.pgid = proc.pid  # start_new_session=True: the engine leads a new session and group
        self.log = engine_log
        self._rotation_error: str | None = None
        self._log_keeper = asyncio.create_task(self._keep_log(log_check_interval), name=f"engine-log-{self.pid}")

    @classmethod
    async def spawn(cls, argv: list[str], env: Mapping[str, str], log_path: Path, max_bytes: int,
                    backups: int, *, log_check_interval: float = LOG_CHECK_INTERVAL) -> EngineProcess:
        """Start ``argv`` (never through a shell) in a new session, its stdout and stderr the log file itself.

        No pipe through the agent (``agent.engine_log``): the engine keeps logging, and stays stoppable, after
        the agent is gone."""
        out = open_for_engine(log_path)
        try:
            engine_log = EngineLog(log_path, max_bytes, backups)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                    stderr=asyncio.subprocess.STDOUT, start_new_session=True)
            except OSError:
                engine_log.close()
                raise
        finally:
            os.close(out)  # the engine has its own copy
        return cls(proc, engine_log, log_check_interval)

    def log_tail(self) -> list[str]:
        """The engine's last lines, read from its log file now."""
        return self.log.tail()

    async def _keep_log(self, interval: float) -> None:
        """Rotate the log when it passes its cap: a stat every ``interval`` seconds, a copy once per rotation."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(until_tick(loop.time(), interval))  # with every other engine's (agent.ticks)
            try:
                self.log.check()
                self._rotation_error = None
            except OSError as exc:  # a full or read-only disk: the engine runs on, the file grows; said once
                if str(exc) != self._rotation_error:
                    log.warning("engine %d: cannot rotate %s: %s", self.pid, self.log.path, exc)
                self._rotation_error = str(exc)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def gone(self) -> bool:
        """Exited, even if the exit is not yet reaped (``returncode`` is set only once it is)."""
        return self.proc.returncode is not None or process_gone(self.pid)

    @property
    def how_it_ended(self) -> str:
        return "still running" if self.proc.returncode is None else describe_exit(self.proc.returncode)

    async def last_words(self) -> list[str]:
        return self.log_tail()

    async def exited(self) -> int:
        """The leader's exit code, as soon as it exits.

        The engine holds no pipe of the agent's: before Python 3.12 ``Process.wait()`` also waited for the
        output pipes to close, and vLLM's EngineCore and workers inherit them, so a killed API server looked
        alive for as long as its children ran (found with a kill -9 of a real vLLM server)."""
        return await self.proc.wait()

    async def wait(self) -> int:
        """Wait for the leader to exit; the exit code."""
        return await self.exited()

    async def stop(self, grace: float) -> int:
        """SIGTERM the group, SIGKILL it after ``grace`` seconds; return once the whole group is gone.

        SIGCONT follows the SIGTERM, as systemd does: a stopped process (a frozen EngineCore) leaves SIGTERM
        pending and would sit out the whole grace; woken, it can act on it. One that still does not exit is
        killed with the group at the deadline: SIGKILL ends stopped processes too."""
        signal_group(self.pgid, signal.SIGTERM)
        signal_group(self.pgid, signal.SIGCONT)
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
        await kill_group(self.pgid, self.exited)
        self.close()

    def close(self) -> None:
        """Stop keeping the log; its last lines stay readable through ``log_tail``."""
        if not self._log_keeper.done():
            self._log_keeper.cancel()
        self.log.close()

    def kill_now(self) -> None:
        """Synchronous last resort (interpreter exit): SIGKILL the group without waiting."""
        signal_group(self.pgid, signal.SIGKILL)
