"""A stack dump of a replica's engine (py-spy) taken before a restart destroys the evidence of a stall.

A wedged EngineCore reads healthy (vLLM #39863, #17972): what it was doing when it stopped moving tokens is
only in its Python stacks, and a restart throws them away. So before the agent drains an engine for a
generation that asks for it (``ReplicaSpec.capture_stack``), it runs ``py-spy dump --subprocesses`` over the
engine's process tree (vLLM's work runs in the ``VLLM::EngineCore`` child) under a hard timeout: the restart
is never delayed longer than that, and a failure (py-spy missing, ptrace refused) is itself the result.

py-spy suspends the process for a consistent snapshot (ptrace), and that fails on a process already stopped (a
frozen API server under SIGSTOP: "Failed to suspend process", waitpid reports the stop it did not cause). Then
the dump is taken again with ``--nonblocking``, which reads the memory of the running (or stopped) process
without suspending it: its stacks may be torn mid-update, and the note says they were read that way. Where
both fail (an unknown Python build, a process gone half-way), what the kernel knows is kept instead
(``kernel_stacks``): each thread's state, wait channel and, where readable (root), kernel stack, from /proc.

The dump travels as a ``ReplicaEvent`` message, capped at 4,000 characters; ``condense`` keeps every process
and thread header and the top (innermost) frames of each thread, which is where a wedge shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

import psutil

MESSAGE_LIMIT = 4000  # ReplicaEvent.message's max_length
DEFAULT_TIMEOUT = 10.0
FRAME_INDENT = "    "


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one command to completion or raises ``TimeoutError`` (having ended it) after ``limit`` seconds."""

    async def __call__(self, argv: list[str], limit: float) -> RunResult: ...


async def run_subprocess(argv: list[str], limit: float) -> RunResult:
    """The real runner: an exec'd child, killed (and reaped) if it outlives ``limit`` seconds."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return RunResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


def find_py_spy(configured: Path | None = None, *, path: str | None = None,
                python: str = sys.executable) -> str | None:
    """The py-spy to run: the configured one, else one on PATH, else one beside the agent's Python."""
    if configured is not None:
        return str(configured) if os.access(configured, os.X_OK) else None
    found = shutil.which("py-spy", path=path)
    if found is not None:
        return found
    beside = Path(python).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


@dataclass(frozen=True)
class StackDump:
    """What a capture produced: the (condensed) dump, or None, and one line saying what happened."""

    note: str
    text: str | None = None

    @property
    def message(self) -> str:
        """The event message: the note on the first line, then the dump (the control plane splits them)."""
        body = f"{self.note}\n\n{self.text}" if self.text else self.note
        return condense(body, MESSAGE_LIMIT)


def condense(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """Fit a py-spy dump into ``limit`` characters: keep every header, cut each thread to its top frames."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    for depth in (12, 8, 5, 3, 2, 1):
        kept: list[str] = []
        frames = 0
        for line in lines:
            if not line.startswith(FRAME_INDENT):
                frames = 0
                kept.append(line)
                continue
            frames += 1
            if frames <= depth:
                kept.append(line)
            elif frames == depth + 1:
                kept.append(f"{FRAME_INDENT}...")
        out = "\n".join(kept)
        if len(out) <= limit:
            return out
    marker = "\n... (cut at the event size limit)"
    return out[: limit - len(marker)] + marker


class StackDumper:
    """Takes dumps with one py-spy executable; its version is read once, with the first dump."""

    def __init__(self, py_spy: str | None, node: str, *, runner: Runner = run_subprocess,
                 timeout: float = DEFAULT_TIMEOUT, wall: Callable[[], datetime]) -> None:
        self.py_spy = py_spy
        self.node = node
        self.runner = runner
        self.timeout = timeout
        self.wall = wall
        self._version: str | None = None

    async def dump(self, pid: int, core: str = "") -> StackDump:
        """Dump ``pid`` and its children; never raises, never takes much longer than ``timeout``. ``core``: the
        process title of the engine's busy loop (its adapter's ``core_process``), named in the note when found."""
        dump = await self._dump(pid)
        found = core_pid(pid, core) if core else None
        if found is None:
            return dump
        return StackDump(f"{dump.note}; the engine's busy loop, {core}, is pid {found}", dump.text)

    async def _dump(self, pid: int) -> StackDump:
        if self.py_spy is None:
            return self._kernel(pid, f"py-spy not installed on node {self.node}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        failed: list[str] = []
        for extra in ([], ["--nonblocking"]):
            try:
                if self._version is None:
                    version = await self.runner([self.py_spy, "--version"], min(2.0, self.timeout))
                    self._version = version.stdout.strip() or "py-spy"
                left = deadline - loop.time()
                if left <= 0.1:
                    raise TimeoutError
                result = await self.runner([self.py_spy, "dump", "--pid", str(pid), "--subprocesses", *extra], left)
            except TimeoutError:
                failed.append(f"py-spy gave no dump of pid {pid} within {self.timeout:g}s")
                break
            except OSError as exc:  # vanished or not executable since it was found
                failed.append(f"cannot run {self.py_spy}: {exc}")
                break
            if result.returncode == 0 and result.stdout.strip():
                at = self.wall().isoformat(timespec="seconds")
                how = (f" without suspending it (--nonblocking: stacks may be torn), after: {failed[0]}"
                       if extra else "")
                return StackDump(f"captured by {self._version} at {at} from pid {pid} on node {self.node}{how}",
                                 result.stdout.strip())
            error = py_spy_error(result.stderr) or f"exit code {result.returncode}"
            if _ptrace(result.stderr):  # not allowed to read it at all: reading without suspending fails too
                failed.append(f"py-spy failed on pid {pid}: {error} (ptrace refused: run the agent as root or "
                              "with CAP_SYS_PTRACE)")
                break
            failed.append(f"py-spy failed on pid {pid}: {error}")
        return self._kernel(pid, "; then ".join(failed) + f" on node {self.node}")

    def _kernel(self, pid: int, why: str) -> StackDump:
        """No Python stacks: the kernel's view of the process tree instead, if there is one to read."""
        text = kernel_stacks(pid)
        if text is None:
            return StackDump(f"no stack dump: {why}")
        at = self.wall().isoformat(timespec="seconds")
        return StackDump(f"no Python stacks ({why}); kernel view of pid {pid} at {at}: each thread's state, wait "
                         "channel and kernel stack", text)


def py_spy_error(stderr: str) -> str:
    """py-spy's error and its causes on one line ("Error: A", "Caused by:", "0: B", "1: C" -> "A: B: C"), without
    the backtrace that follows."""
    parts: list[str] = []
    for line in stderr.splitlines():
        text = line.strip()
        if not text or text == "Caused by:":
            continue
        if text.startswith("Stack backtrace"):
            break
        head, sep, rest = text.partition(": ")
        if text.startswith("Error: "):
            parts.append(text.removeprefix("Error: "))
        elif sep and head.isdigit():
            parts.append(rest)
        elif not parts:
            parts.append(text)
    return ": ".join(parts)[:300]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # gone, or not ours to read (a kernel stack needs root)
        return None


def core_pid(pid: int, title: str) -> int | None:
    """The pid of the process in ``pid``'s tree whose name or command line starts with ``title`` (vLLM's
    ``VLLM::EngineCore``, SGLang's ``sglang::scheduler``); None when there is none."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return None
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.name().startswith(title) or " ".join(proc.cmdline()).startswith(title):
                return proc.pid
    return None


def kernel_stacks(pid: int) -> str | None:
    """Each thread of ``pid`` and its descendants as the kernel sees it: name, state, wait channel and kernel
    stack (``/proc/<pid>/task/<tid>/stack``, root only), laid out as py-spy lays out a dump (a header per process
    and thread, frames indented) so ``condense`` fits it the same way. None when ``pid`` is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    blocks: list[str] = []
    for proc in procs:
        base = Path("/proc") / str(proc.pid)
        cmdline = (_read(base / "cmdline") or "").replace("\x00", " ").strip()
        lines = [f"Process {proc.pid}: {cmdline or _read(base / 'comm') or '?'}"]
        try:
            tids = sorted(int(t.name) for t in (base / "task").iterdir())
        except OSError:
            continue
        for tid in tids:
            task = base / "task" / str(tid)
            stat = _read(task / "stat") or ""
            state = stat.rpartition(")")[2].split()[:1]  # the field after the name, which may hold spaces
            wchan = _read(task / "wchan")
            lines.append(f'Thread {tid} ({state[0] if state else "?"}, waiting in {wchan or "-"}): '
                         f'"{_read(task / "comm") or "?"}"')
            stack = _read(task / "stack")
            lines += [f"{FRAME_INDENT}{frame.split('] ', 1)[-1]}" for frame in (stack or "").splitlines()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else None


def _ptrace(stderr: str) -> bool:
    lowered = stderr.lower()
    return "permission denied" in lowered or "operation not permitted" in lowered
