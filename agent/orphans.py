"""Processes holding memory on this node's GPUs that no replica of this agent started (gpustack#2595).

An engine left behind by a crashed agent, a hand-started ``vllm serve`` or a stuck worker of a previous
generation keeps its GPU memory, and the next engine on that GPU fails with out-of-memory. The GPU backend
names every pid with memory on each GPU; a pid is ours when it belongs to a managed replica's engine: in
its process tree, or in its process group (vLLM's EngineCore and workers are spawned a moment after the
API server, so the group decides before the next tree walk does). Everything else is an orphan: reported
(an ``orphan`` event once per process, and ``pitstop_gpu_orphan_processes``) and ended only when the
config says ``kill_orphans: true``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Orphan:
    pid: int
    gpu: int
    memory_bytes: int
    command: str


def candidates(gpu_processes: dict[int, dict[int, int]], owned: Collection[int]) -> list[tuple[int, int, int]]:
    """(pid, gpu, bytes) of every process with memory on a GPU that is not in ``owned``. Pure."""
    return sorted((pid, gpu, used) for gpu, procs in gpu_processes.items() for pid, used in procs.items()
                  if used > 0 and pid not in owned)


def _in_engine(pid: int, roots: Collection[int]) -> bool:
    """``pid`` is a replica engine's process: its group is an engine's group, or an ancestor is an engine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) in roots:
            return True
    try:
        return any(parent.pid in roots for parent in psutil.Process(pid).parents())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _command(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:500] or f"[pid {pid}]"
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return f"[pid {pid}]"


class OrphanWatch:
    """Remembers the orphans seen, so each one is announced once and the count per GPU can be exported."""

    def __init__(self, kill: bool = False, describe: Callable[[int], str] = _command,
                 in_engine: Callable[[int, Collection[int]], bool] = _in_engine) -> None:
        self.kill = kill
        self.describe = describe
        self.in_engine = in_engine
        self.current: dict[tuple[int, int], Orphan] = {}
        self._signalled: set[int] = set()

    def check(self, gpu_processes: dict[int, dict[int, int]], owned: Iterable[int],
              roots: Collection[int]) -> list[Orphan]:
        """Update the current orphans from one GPU reading; return the ones not seen before."""
        owned_set = {os.getpid(), *owned}
        found: dict[tuple[int, int], Orphan] = {}
        for pid, gpu, used in candidates(gpu_processes, owned_set):
            if self.in_engine(pid, roots):
                continue
            known = self.current.get((pid, gpu))
            found[(pid, gpu)] = Orphan(pid, gpu, used, known.command if known else self.describe(pid))
        new = [o for key, o in found.items() if key not in self.current]
        self.current = found
        self._signalled &= {pid for pid, _ in found}
        return new

    def end(self) -> list[int]:
        """With ``kill``: SIGTERM each orphan once, SIGKILL it if it is still there at the next check."""
        if not self.kill:
            return []
        ended = []
        for pid in sorted({o.pid for o in self.current.values()}):
            try:
                proc = psutil.Process(pid)
                if pid in self._signalled:
                    proc.kill()
                else:
                    proc.terminate()
                    self._signalled.add(pid)
                ended.append(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return ended

    def per_gpu(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for orphan in self.current.values():
            counts[orphan.gpu] = counts.get(orphan.gpu, 0) + 1
        return counts
