"""Process-tree readings of one replica: the API server plus EngineCore/worker children (psutil).

vLLM's host-memory leaks live in the EngineCore and worker children, not in the API server (vLLM #44175,
#43639), so RSS is summed over the whole tree; the engine's own /metrics do not show it.
"""

from __future__ import annotations

from collections.abc import Iterable

import psutil

from agent.wire import ProcessSample


def tree_pids(pid: int) -> set[int]:
    """``pid`` and all its living descendants (empty when ``pid`` is gone)."""
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()


class ProcessTreeSampler:
    """Samples one process tree; keeps ``psutil.Process`` objects so CPU % is measured between calls."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def _members(self, pid: int) -> list[psutil.Process]:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
        kept: dict[int, psutil.Process] = {}
        for proc in members:
            # Reuse the cached object only if it is the same process (same pid and create time).
            cached = self._procs.get(proc.pid)
            kept[proc.pid] = cached if cached is not None and cached == proc else proc
        self._procs = kept
        return list(kept.values())

    def sample(self, pid: int | None, gpu_memory: dict[int, int] | None = None) -> ProcessSample:
        """Figures for the tree rooted at ``pid``; ``gpu_memory`` maps pid -> GPU bytes (from the GPU backend)."""
        if pid is None:
            self._procs = {}
            return ProcessSample()
        try:
            members = self._members(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs = {}
            return ProcessSample(pid=pid)
        rss = threads = fds = 0
        cpu = 0.0
        alive = 0
        for proc in members:
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(interval=None)
                    threads += proc.num_threads()
                    fds += _num_fds(proc)
                alive += 1
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        gpu = sum_gpu_memory(gpu_memory or {}, (p.pid for p in members)) if gpu_memory is not None else None
        return ProcessSample(pid=pid, rss_bytes=rss, cpu_percent=cpu, num_threads=threads, num_fds=fds,
                             num_processes=alive, gpu_memory_bytes=gpu)


def _num_fds(proc: psutil.Process) -> int:
    try:
        return proc.num_fds()
    except (AttributeError, psutil.AccessDenied):  # not on Windows; other users' processes
        return 0


def sum_gpu_memory(per_pid: dict[int, int], pids: Iterable[int]) -> int:
    """GPU bytes used by any of ``pids`` (the replica's process and its children), over all GPUs."""
    return sum(per_pid.get(pid, 0) for pid in pids)
