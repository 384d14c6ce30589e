"""The memory a container's cgroup is charged, read from the host for an engine in a container (``agent.containers``).

The engine's process tree (``agent.process_tree``, read through the host pids) gives its resident set, what the
leak policies read in both runtimes. The cgroup adds what the kernel charges the container as a whole, page
cache and kernel memory included, and the limit it enforces: past the limit the kernel's OOM killer ends the
container ("container exited with code 137, OOMKilled"). Both cgroup versions are read: v2 (``memory.current``,
``memory.max``) and v1's memory controller (``memory.usage_in_bytes``, ``memory.limit_in_bytes``), which hosts
with hybrid cgroups still use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit count; anything this large is no limit.
NO_LIMIT_ABOVE = 2**62


@dataclass(frozen=True)
class CgroupMemory:
    usage_bytes: int
    limit_bytes: int | None  # None: no limit set


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def cgroup_memory(pid: int, *, proc: Path = PROC, root: Path = CGROUP_ROOT) -> CgroupMemory | None:
    """The memory charged to ``pid``'s cgroup, or None where it cannot be read (the process gone, no memory
    controller, a cgroup the agent cannot see)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1 = path
        elif controllers == "":
            unified = path
    if v1 is not None:
        folder = root / "memory" / v1.lstrip("/")
        usage, limit = _read_int(folder / "memory.usage_in_bytes"), _read_int(folder / "memory.limit_in_bytes")
    elif unified is not None:
        folder = root / unified.lstrip("/")
        usage, limit = _read_int(folder / "memory.current"), _read_int(folder / "memory.max")
    else:
        return None
    if usage is None:
        return None
    return CgroupMemory(usage, None if limit is None or limit >= NO_LIMIT_ABOVE else limit)
