"""Process-tree readings of one replica: the API server plus EngineCore/worker children (psutil).

vLLM's host-memory leaks live in the EngineCore and worker children, not in the API server (vLLM #44175,
#43639), so RSS is summed over the whole tree; the engine's own /metrics do not show it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil

from agent.wire import ProcessSample


def client_connections(pid: int, port: int) -> int | None:
    """Client connections established to the engine's ``port``, as the kernel of process ``pid``'s network
    namespace lists them, the agent's own left out: the requests a wedged engine holds (its gauges read 0 then,
    vLLM #39863). A connection still in the listen backlog counts too: a frozen API server accepts nothing, so
    the requests sent to it after it froze never reach one of its descriptors, yet each is lost with it. Idle
    keep-alive connections of a load balancer count as well: an upper bound, not an exact figure. ``None`` when
    the tables cannot be read (the process gone, or not ours to read)."""
    tables = []
    for name in ("tcp", "tcp6"):
        try:
            tables.append(Path(f"/proc/{pid}/net/{name}").read_text())
        except FileNotFoundError:
            continue  # a kernel without IPv6
        except OSError:
            return None
    if not tables:
        return None
    entries = [entry for table in tables for entry in _tcp_entries(table)]
    own = _socket_inodes(os.getpid())
    mine = {local for local, remote, _, inode in entries if remote[1] == port and inode in own}
    return sum(1 for local, remote, state, _ in entries
               if state == _ESTABLISHED and local[1] == port and remote not in mine)


_ESTABLISHED = "01"  # the state column of /proc/net/tcp (include/net/tcp_states.h)
Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


def _tcp_entries(table: str) -> Iterator[tuple[Endpoint, Endpoint, str, str]]:
    """(local, remote, state, inode) of each socket in a ``/proc/<pid>/net/tcp`` or ``tcp6`` table."""
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9:
            with contextlib.suppress(ValueError):
                yield _endpoint(fields[1]), _endpoint(fields[2]), fields[3], fields[9]


def _endpoint(text: str) -> Endpoint:
    """``0100007F:1F90`` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit word of the address is in the
    host's byte order. An IPv4 peer of a dual-stack socket reads as its IPv4 address, as in the IPv4 table."""
    address, port = text.split(":")
    raw = b"".join(int(address[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(address), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(port, 16)


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (``socket:[inode]`` links under /proc/<pid>/fd)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    return inodes


def tree_pids(pid: int) -> set[int]:
    """``pid`` and all its living descendants (empty when ``pid`` is gone)."""
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()


def descendants(pid: int) -> list[int] | None:
    """Every descendant of ``pid`` from ``/proc/<pid>/task/*/children`` (Linux); ``None`` if ``pid`` is gone."""
    out: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            if parent == pid:
                return None
            continue  # a child that exited meanwhile
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:  # the thread ended meanwhile
                continue
            out.extend(children)
            pending.extend(children)
    return out


class ProcessTreeSampler:
    """Samples one process tree; keeps ``psutil.Process`` objects so CPU % is measured between calls.

    psutil finds children by reading every process on the host (``/proc/*/stat``); where the kernel offers
    ``/proc/<pid>/task/<tid>/children`` the tree is read from there instead (microseconds, not milliseconds).
    Either way an engine's tree is stable once started, so after its first
    ``rescan_interval`` seconds (walked at every sample while it spawns its children) it is walked again only
    when the root changes, a member exits, or ``rescan_interval`` seconds have passed.
    """

    def __init__(self, rescan_interval: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.rescan_interval = rescan_interval
        self.clock = clock
        self._procs: dict[int, psutil.Process] = {}
        self._root: int | None = None
        self._scanned_at = -math.inf
        self._root_since = -math.inf
        self._task_children = Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children").exists()

    @property
    def pids(self) -> set[int]:
        """The pids of the tree as last sampled."""
        return set(self._procs)

    def _members(self, pid: int) -> list[psutil.Process]:
        now = self.clock()
        if pid != self._root:
            self._root_since = now
        # A young engine is still spawning its children (vLLM: EngineCore, then workers): walk every time.
        settled = now - self._root_since >= self.rescan_interval
        if pid == self._root and settled and now - self._scanned_at < self.rescan_interval \
                and all(p.is_running() for p in self._procs.values()):
            return list(self._procs.values())
        root = psutil.Process(pid)
        found = descendants(pid) if self._task_children else None
        if found is None:
            members = [root, *root.children(recursive=True)]
        else:
            members = [root]
            for child in found:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    members.append(psutil.Process(child))
        kept: dict[int, psutil.Process] = {}
        for proc in members:
            # Reuse the cached object only if it is the same process (same pid and create time).
            cached = self._procs.get(proc.pid)
            kept[proc.pid] = cached if cached is not None and cached == proc else proc
        self._procs = kept
        self._root, self._scanned_at = pid, now
        return list(kept.values())

    def sample(self, pid: int | None, gpu_memory: dict[int, int] | None = None) -> ProcessSample:
        """Figures for the tree rooted at ``pid``; ``gpu_memory`` maps pid -> GPU bytes (from the GPU backend)."""
        if pid is None:
            self._procs, self._root = {}, None
            return ProcessSample()
        try:
            members = self._members(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs, self._root = {}, None
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
