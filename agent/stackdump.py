"""A stack dump of a replica's engine (py-spy) taken before a restart destroys the evidence of a stall.

A wedged EngineCore reads healthy (vLLM #39863, #17972): what it was doing when it stopped moving tokens is
only in its Python stacks, and a restart throws them away. So before the agent drains an engine for a
generation that asks for it (``ReplicaSpec.capture_stack``), it runs ``py-spy dump --subprocesses`` over the
engine's process tree (vLLM's work runs in the ``VLLM::EngineCore`` child) under a hard timeout: the restart
is never delayed longer than that, and a failure (py-spy missing, ptrace refused) is itself the result.

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


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


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

    async def dump(self, pid: int) -> StackDump:
        """Dump ``pid`` and its children; never raises, never takes much longer than ``timeout``."""
        if self.py_spy is None:
            return StackDump(f"no stack dump: py-spy not installed on node {self.node}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        try:
            if self._version is None:
                version = await self.runner([self.py_spy, "--version"], min(2.0, self.timeout))
                self._version = version.stdout.strip() or "py-spy"
            left = max(0.1, deadline - loop.time())
            result = await self.runner([self.py_spy, "dump", "--pid", str(pid), "--subprocesses"], left)
        except TimeoutError:
            return StackDump(f"no stack dump: py-spy gave no dump of pid {pid} within {self.timeout:g}s "
                             f"on node {self.node}")
        except OSError as exc:  # vanished or not executable since it was found
            return StackDump(f"no stack dump: cannot run {self.py_spy} on node {self.node}: {exc}")
        if result.returncode != 0 or not result.stdout.strip():
            error = _first_line(result.stderr) or f"exit code {result.returncode}"
            hint = " (ptrace refused: run the agent as root or with CAP_SYS_PTRACE)" if _ptrace(result.stderr) else ""
            return StackDump(f"no stack dump: py-spy failed on pid {pid} on node {self.node}: {error}{hint}")
        at = self.wall().isoformat(timespec="seconds")
        return StackDump(f"captured by {self._version} at {at} from pid {pid} on node {self.node}",
                         result.stdout.strip())


def _ptrace(stderr: str) -> bool:
    lowered = stderr.lower()
    return "permission denied" in lowered or "operation not permitted" in lowered
