"""The demo's processes: each child leads a process group of its own, all are stopped together within one
deadline, and whatever a demo left behind is found again by the mark in its environment.

Every process the demo starts, and everything those start (the agent's engines, the control plane's policy
process), carries ``PITSTOP_DEMO_STATE=<state dir>`` in its environment (``MARK``). The engines lead sessions of
their own (an agent's engines outlive it, to be adopted), so no process-group signal to the agent reaches
them: the mark is what finds them when the agent could not stop them itself, and what finds the whole fleet of
a demo that was killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MARK = "PITSTOP_DEMO_STATE"


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,  # its own process group: we stop it and everything it spawned
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL what is left of it after ``grace`` seconds."""
        stop_together([self], grace)


def tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants that are alive now (none if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def marked(state: str) -> list[psutil.Process]:
    """Processes carrying the demo's mark for ``state`` in their environment, this one excluded."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(MARK) == state and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # gone, a zombie, or another user's: not ours to stop
            continue
    return found


def running(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running; a zombie counts as gone (it holds nothing, only its exit status)."""
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_proc(proc: psutil.Process, sig: signal.Signals) -> None:
    """``sig`` to ``proc``, and to its whole group when it leads one (an engine and its workers)."""
    with contextlib.suppress(psutil.Error, OSError):
        if os.getpgid(proc.pid) == proc.pid:
            signal_group(proc.pid, sig)
        else:
            proc.send_signal(sig)


class Stop:
    """One stop of many children at once: each SIGTERMed when asked, all waited for together, and at the
    deadline every group and process still there SIGKILLed.

    A child's descendants are remembered when it is signalled: once it exits they are reparented, and its
    group no longer reaches an engine in a session of its own.
    """

    def __init__(self, deadline: float, mark: str | None = None) -> None:
        self.deadline = deadline  # time.monotonic()
        self.mark = mark
        self.children: list[Child] = []
        self.seen: dict[int, tuple[psutil.Process, int]] = {}  # pid -> (process, the child it was found under)

    def terminate(self, children: Iterable[Child]) -> None:
        for child in children:
            if child.proc is None or child in self.children:
                continue
            self.children.append(child)
            self._remember(child)
            if child.proc.returncode is None:
                signal_group(child.proc.pid, signal.SIGTERM)
                signal_group(child.proc.pid, signal.SIGCONT)  # a stopped process leaves SIGTERM pending

    def wait(self, children: Sequence[Child], until: float) -> bool:
        """Wait until every process of ``children`` is gone, or ``until`` (at most the deadline); True when
        they are."""
        roots = {child.proc.pid for child in children if child.proc is not None}
        procs = [proc for proc, root in self.seen.values() if root in roots]
        until = min(until, self.deadline)
        while running(procs):
            if time.monotonic() >= until:
                return False
            time.sleep(0.1)
        return True

    def finish(self, kill_wait: float = 3.0) -> list[psutil.Process]:
        """Wait for everything signalled until the deadline, SIGKILL what is left (and whatever else carries
        the mark), reap the children; return the processes that survived even that."""
        self.wait(self.children, self.deadline)
        for child in self.children:
            self._remember(child)  # anything a child started after its SIGTERM
        # A leader not yet reaped pins its pid, so its group id cannot have been reused: safe to kill by group.
        for child in self.children:
            if child.proc is not None and child.proc.returncode is None:
                signal_group(child.proc.pid, signal.SIGKILL)
        until = time.monotonic() + kill_wait
        while True:
            left = running(proc for proc, _ in self.seen.values()) + (marked(self.mark) if self.mark else [])
            if not left or time.monotonic() >= until:
                break
            for proc in left:  # again each round: a scan may find what started after the last one
                signal_proc(proc, signal.SIGKILL)
            time.sleep(0.1)
        for child in self.children:
            if child.proc is not None:
                child.proc.poll()  # reap: no zombie of ours outlives the stop
        return left

    def _remember(self, child: Child) -> None:
        if child.proc is not None:
            for proc in tree(child.proc.pid):
                self.seen.setdefault(proc.pid, (proc, child.proc.pid))


def stop_together(children: Sequence[Child], grace: float) -> None:
    """SIGTERM every child's group at once, SIGKILL what is left after ``grace`` seconds."""
    stop = Stop(time.monotonic() + grace)
    stop.terminate(children)
    for proc in stop.finish():
        print(f"pitstop: process {proc.pid} did not exit after SIGKILL", file=sys.stderr)


def stop_leftovers(state: str, grace: float = 5.0) -> list[psutil.Process]:
    """Stop every process an earlier demo of ``state`` left (SIGTERM, SIGKILL after ``grace``); return them."""
    found: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        left = marked(state)
        if not left:
            return list(found.values())
        for proc in left:  # an orphaned agent may restart an engine while it goes: each newcomer gets it too
            if proc.pid not in found:
                found[proc.pid] = proc
                signal_proc(proc, signal.SIGTERM)
                signal_proc(proc, signal.SIGCONT)
        time.sleep(0.2)
    for _ in range(50):
        left = marked(state)
        if not left:
            break
        for proc in left:
            found.setdefault(proc.pid, proc)
            signal_proc(proc, signal.SIGKILL)
        time.sleep(0.1)
    return list(found.values())
