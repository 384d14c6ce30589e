"""The demo's standard output and error, which may go away while it runs: ``make demo | tee demo.log`` with
tee killed, ``pitstop demo | head -1``, a closed terminal.

A write to a pipe nobody reads fails (EPIPE; Python ignores SIGPIPE), and so does a write to a terminal that
hung up (EIO). Either would abort whatever was printing, the stop included, and leave the fleet running. So
every write goes through ``_Guarded``: when one fails, the stream's file descriptor is pointed at the demo's
own log (``dup2``), the write is retried there, and the demo is told its output is gone. A demo with nothing
to print notices too: Linux's poll() reports POLLERR on a pipe's write end once its read end is closed, and
POLLHUP on a terminal that hung up; ``lost()`` checks both.
"""

from __future__ import annotations

import io
import os
import select
import sys
from pathlib import Path
from typing import TextIO, cast

GONE = select.POLLERR | select.POLLHUP


class Output:
    """Guards ``sys.stdout`` and ``sys.stderr`` while installed; ``lost()`` says whether a reader went away."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.gone = False
        self._saved: tuple[TextIO, TextIO] | None = None

    def install(self) -> None:
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = cast(TextIO, _Guarded(sys.stdout, 1, self))
        sys.stderr = cast(TextIO, _Guarded(sys.stderr, 2, self))

    def uninstall(self) -> None:
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None

    def lost(self) -> bool:
        """Whether stdout or stderr lost its reader (what did is diverted to the log from now on)."""
        for fd in (1, 2):
            poller = select.poll()
            try:
                poller.register(fd, GONE)
                events = poller.poll(0)
            except (OSError, ValueError):
                continue
            if any(ev & (GONE | select.POLLNVAL) for _, ev in events):
                self.divert(fd)
        return self.gone

    def divert(self, fd: int) -> None:
        """Point ``fd`` at the demo's log: what is printed from now on is kept there."""
        self.gone = True
        self.log.parent.mkdir(parents=True, exist_ok=True)
        target = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.dup2(target, fd)
        finally:
            os.close(target)


class _Guarded(io.TextIOBase):
    """A text stream that, when a write fails, diverts its descriptor to the log and writes there."""

    def __init__(self, stream: TextIO, fd: int, output: Output) -> None:
        super().__init__()
        self._stream = stream
        self._fd = fd
        self._output = output

    def write(self, s: str) -> int:
        try:
            return self._stream.write(s)
        except OSError:
            self._output.divert(self._fd)
        try:
            return self._stream.write(s)
        except OSError:  # not even the log can be written: the stop matters more than its words
            return len(s)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._output.divert(self._fd)
            try:
                self._stream.flush()
            except OSError:
                return

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding
