"""An engine a previous agent started and left running, taken over by this agent (``PidFile.leftover``).

An agent killed with SIGKILL (or restarted by systemd after a crash or an upgrade) leaves its engines running:
they lead sessions of their own on purpose. Ending them would restart every engine of the node for an agent
restart, and abort what they were streaming; so the next agent adopts them. An adopted engine is not this
process's child: its exit is seen through a pidfd (``engine_proc.pid_exit``; a reused pid is told apart by its
create time), its exit code is unknown. It writes its own log file (``agent.engine_log``), which this agent tails
and rotates as for an engine it started; signals go to its process group, as for those
(``engine_proc.EngineProcess``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from agent.engine_log import EngineLog, last_lines
from agent.engine_proc import LOG_CHECK_INTERVAL, kill_group, pid_exit, process_gone, signal_group
from agent.ticks import until_tick

log = logging.getLogger(__name__)

UNKNOWN_EXIT = -1  # not our child: the exit code went to whoever reaped it
POLL_SECONDS = 0.1  # where no pidfd can watch the pid


class AdoptedEngine:
    """The engine process a previous agent left; the same calls as ``EngineProcess``."""

    def __init__(self, pid: int, created: float, log_path: Path, max_bytes: int, backups: int, *,
                 poll: float = POLL_SECONDS) -> None:
        self.pid = pid
        self.pgid = pid  # it was spawned with start_new_session: it leads its group
        self.created = created
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch(exist_ok=True)
        self.log = EngineLog(log_path, max_bytes, backups)
        self.returncode: int | None = None
        self._poll = poll
        self._exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watch = asyncio.create_task(self._watch_exit(), name=f"adopted-engine-{pid}")
        self._log_keeper = asyncio.create_task(self._keep_log(), name=f"adopted-engine-log-{pid}")

    async def _watch_exit(self) -> None:
        await pid_exit(self.pid, self.created, self._poll)
        self.returncode = UNKNOWN_EXIT
        if not self._exited.done():
            self._exited.set_result(None)

    async def _keep_log(self) -> None:
        """Rotate the log past its cap, on the same ticks as every other engine's (``EngineProcess._keep_log``)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(until_tick(loop.time(), LOG_CHECK_INTERVAL))
            try:
                self.log.check()
            except OSError as exc:
                log.warning("engine %d: cannot rotate %s: %s", self.pid, self.log_path, exc)

    @property
    def gone(self) -> bool:
        """Exited, even before the next poll notices (``returncode`` is set then)."""
        return self.returncode is not None or process_gone(self.pid, self.created)

    @property
    def how_it_ended(self) -> str:
        return "still running" if self.returncode is None else "exit code unknown"  # it went to its parent

    def log_tail(self) -> list[str]:
        """The engine's last lines, from the log file it writes (its earlier lines included)."""
        return last_lines(self.log_path)

    async def last_words(self) -> list[str]:
        return self.log_tail()

    async def exited(self) -> int:
        await asyncio.shield(self._exited)
        return UNKNOWN_EXIT

    async def wait(self) -> int:
        return await self.exited()

    async def stop(self, grace: float) -> int:
        """SIGTERM (then SIGCONT) the group, SIGKILL it after ``grace``; return once the whole group is gone."""
        signal_group(self.pgid, signal.SIGTERM)
        signal_group(self.pgid, signal.SIGCONT)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.exited(), timeout=grace)
        await self.kill()
        return UNKNOWN_EXIT

    async def kill(self) -> None:
        """SIGKILL whatever is left of the group and wait for the leader to be gone."""
        await kill_group(self.pgid, self.exited)
        self.close()

    def close(self) -> None:
        for task in (self._watch, self._log_keeper):
            if not task.done():
                task.cancel()
        self.log.close()

    def kill_now(self) -> None:
        signal_group(self.pgid, signal.SIGKILL)
