"""An engine's log file: the engine writes it itself, the agent only tails it and rotates it.

The engine's stdout and stderr are the file, opened by the agent at spawn with ``O_APPEND``, never a pipe
through the agent. A pipe ties the engine to the agent: once the agent is gone each write fails, and a
simulated engine whose SIGTERM handler logged before acting then ignored every SIGTERM. With the file, an agent
crash or restart leaves the engine logging, and its next SIGTERM stops it.

What the agent needs from the output (the last lines, a crash's ``log_tail``) it reads from the file, in
bounded steps from the offset it last read (``LogTail``), and only when asked: the engine's output costs the
agent nothing while nobody reads it. Rotation is logrotate's ``copytruncate`` (``rotate``): the engine holds
the file open, so the file is copied to ``<name>.log.1`` and truncated in place, and ``O_APPEND`` puts the
engine's next write at the start of the emptied file. Rotate it from outside only that way too: a rename
leaves the engine writing into the renamed file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections import deque
from pathlib import Path

TAIL_LINES = 50
TAIL_WINDOW = 64 * 1024  # the most one read takes: older output is skipped, only the last lines matter


def open_for_engine(path: Path) -> int:
    """A descriptor to pass as the engine's stdout and stderr (the caller closes its copy after the spawn)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)


class LogTail:
    """The last lines of a file another process appends to, read from the last offset, at most ``window`` bytes.

    It reads through its own descriptor, so it follows the file the engine writes even if the name is moved.
    A file shorter than the offset was truncated (rotated) and is read again from its start."""

    def __init__(self, path: Path, *, from_end: bool, lines: int = TAIL_LINES, window: int = TAIL_WINDOW) -> None:
        self.window = window
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._offset = os.fstat(self._fd).st_size if from_end else 0
        self._partial = b""
        self._lines: deque[str] = deque(maxlen=lines)

    @property
    def fd(self) -> int:
        return self._fd

    def read(self) -> list[str]:
        """Take in what was written since the last read; the last lines, an unfinished one last."""
        if self._fd < 0:
            return self.lines()
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            self.rewind()
        if size == self._offset:
            return self.lines()
        start = max(self._offset, size - self.window)
        skipped = start > self._offset
        data = os.pread(self._fd, size - start, start)
        self._offset = start + len(data)
        if skipped:  # what comes before the first newline is the end of a line whose start was skipped
            self._partial = b""
            cut = data.find(b"\n")
            data = data[cut + 1:] if cut >= 0 else data  # no newline at all: keep the end of that one line
        *complete, partial = (self._partial + data).split(b"\n")
        self._lines.extend(_text(line) for line in complete)
        self._partial = partial[-self.window:]
        return self.lines()

    def lines(self) -> list[str]:
        """The last lines read, without reading."""
        return [*self._lines, _text(self._partial)] if self._partial else list(self._lines)

    def rewind(self) -> None:
        """The file was emptied: read it again from its start."""
        self._offset = 0
        self._partial = b""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _text(line: bytes) -> str:
    return line.decode(errors="replace").rstrip("\r")


def last_lines(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last lines of ``path`` (an engine a previous agent started), at most ``TAIL_WINDOW`` bytes read."""
    try:
        tail = LogTail(path, from_end=False, lines=lines)
    except FileNotFoundError:
        return []
    try:
        return tail.read()
    finally:
        tail.close()


def rotate(path: Path, backups: int) -> None:
    """Shift ``<name>.log.N`` up (the oldest is dropped), copy the file to ``<name>.log.1``, truncate it in place.

    The copy reads to the end of the file, then the truncation follows at once: only what the engine writes in
    between is lost (logrotate's ``copytruncate`` has the same window)."""
    backup = path.with_name(f"{path.name}.1")
    for n in range(backups, 1, -1):
        older = path.with_name(f"{path.name}.{n - 1}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{n}"))
    if backups > 0:
        shutil.copyfile(path, backup)
    os.truncate(path, 0)


class EngineLog:
    """The agent's side of one engine's log: its tail for reports, and rotation past ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int, backups: int, *, from_end: bool = True) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        # from_end: a new engine's lines only, not its predecessor's; else the file's last lines first (an
        # engine that was running already).
        self._tail = LogTail(path, from_end=from_end)

    def tail(self) -> list[str]:
        """The engine's last lines, read from the file now."""
        return self._tail.read()

    def check(self) -> bool:
        """Rotate the file if it has grown past ``max_bytes`` (its tail read first); whether it rotated.

        Only while the name is still the engine's file: one moved away by someone else is theirs to keep."""
        if self._tail.fd < 0 or os.fstat(self._tail.fd).st_size <= self.max_bytes:
            return False
        with contextlib.suppress(FileNotFoundError):
            named, mine = os.stat(self.path), os.fstat(self._tail.fd)
            if (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino):
                self._tail.read()
                rotate(self.path, self.backups)
                self._tail.rewind()
                return True
        return False

    def close(self) -> None:
        """Read the tail a last time and let go of the file; ``tail()`` keeps answering the last lines."""
        if self._tail.fd >= 0:
            self._tail.read()
            self._tail.close()
