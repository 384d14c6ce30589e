"""A container's cgroup memory read from the host (``agent.cgroup_memory``), on the two layouts hosts have: the
v1 memory controller (hybrid hosts; the paths Podman's cgroupfs manager makes, as read on one) and v2."""

from __future__ import annotations

from pathlib import Path

from agent.cgroup_memory import CgroupMemory, cgroup_memory

CONTAINER = "/libpod_parent/libpod-130246f2fcadc24c4f2a4c47db6a598e38031ba65b3bfd62024a5df2664a75e7"
# /proc/<pid>/cgroup of a process in a Podman container on a hybrid host, as it read.
V1_LINES = [f"{n}:{c}:{CONTAINER}" for n, c in ((9, "name=systemd"), (8, "pids"), (7, "blkio"), (6, "freezer"),
                                               (5, "devices"), (4, "memory"), (3, "cpuset"), (2, "cpuacct"),
                                               (1, "cpu"))] + [f"0::{CONTAINER}"]


def _tree(tmp_path: Path, pid: int, lines: list[str], files: dict[str, str]) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text("\n".join(lines) + "\n")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


def test_v1_reads_the_memory_controllers_usage_and_takes_its_no_limit_for_none(tmp_path: Path) -> None:
    folder = f"memory{CONTAINER}"
    proc, root = _tree(tmp_path, 30554, V1_LINES, {f"{folder}/memory.usage_in_bytes": "59863040\n",
                                                   f"{folder}/memory.limit_in_bytes": "9223372036854771712\n"})
    assert cgroup_memory(30554, proc=proc, root=root) == CgroupMemory(59863040, None)
    (root / folder / "memory.limit_in_bytes").write_text("17179869184\n")  # --memory 16g
    assert cgroup_memory(30554, proc=proc, root=root) == CgroupMemory(59863040, 16 * 2**30)


def test_v2_reads_the_unified_hierarchy(tmp_path: Path) -> None:
    path = "/system.slice/docker-4f1d.scope"
    proc, root = _tree(tmp_path, 7, [f"0::{path}"], {f"{path[1:]}/memory.current": "1048576\n",
                                                     f"{path[1:]}/memory.max": "max\n"})
    assert cgroup_memory(7, proc=proc, root=root) == CgroupMemory(1048576, None)
    (root / path[1:] / "memory.max").write_text("2147483648\n")
    assert cgroup_memory(7, proc=proc, root=root) == CgroupMemory(1048576, 2 * 2**30)


def test_what_cannot_be_read_is_no_reading(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, 8, ["0::/gone"], {})
    assert cgroup_memory(8, proc=proc, root=root) is None  # its cgroup's files are not there
    assert cgroup_memory(9, proc=proc, root=root) is None  # no such process
