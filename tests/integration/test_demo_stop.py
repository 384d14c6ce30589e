"""`pitstop demo` never leaves a fleet behind: each way it can end (Ctrl-C, SIGTERM, SIGHUP, its stdout's reader
gone) stops every process it started within 15 s and writes the timeline; a second demo on the same state dir
names the first, `--replace` takes over, what a SIGKILLed demo left is stopped by the next, and no port held by
another process is ever reported as the demo's.

Processes are found by the mark the demo puts in their environment (``PITSTOP_DEMO_STATE=<state dir>``).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from bench.harness.ports import bindable
from pitstop.demo_procs import marked
from tests.helpers import wait_until

# Every demo takes the first free ports from 8000 up: two at once would race for them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]

MINIMAL = ("--calm", "--no-console", "--no-load", "--no-prometheus", "--replicas", "1")
STOPPED_WITHIN = 15.0  # seconds from the signal to the last process gone: the demo's promise
UP_TIMEOUT = 240.0  # from start to the banner, on a busy machine


def _marked(state: Path) -> list[psutil.Process]:
    """Processes carrying the demo's mark for ``state`` that are alive (a zombie holds nothing)."""
    return marked(str(state))


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        with suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


class Demo:
    """A `pitstop demo` process on ``state``, its output in ``out`` (or a pipe)."""

    def __init__(self, tmp_path: Path, state: Path, *args: str, name: str = "demo", pipe: bool = False) -> None:
        self.state = state
        self.out = tmp_path / f"{name}.out"
        argv = [sys.executable, "-m", "pitstop.cli", "demo", "--state-dir", str(state), *args]
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE if pipe else out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def wait_up(self) -> dict[str, Any]:
        """Wait for the banner's manifest (``demo.json``, with this demo's pid) and return it."""
        def up() -> bool:
            return self.proc.poll() is not None or self._manifest().get("pid") == self.proc.pid

        try:
            wait_until(up, UP_TIMEOUT, interval=0.5, what="the demo up")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.output()}") from None
        assert self.proc.poll() is None, self.output()
        return self._manifest()

    def _manifest(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.state / "demo.json").read_text()))
        except (OSError, ValueError):
            return {}

    def stopped_within(self, seconds: float, since: float) -> int:
        """Wait until the demo exited and nothing with its mark is alive, ``seconds`` after ``since``; its
        exit status."""
        try:
            wait_until(lambda: self.proc.poll() is not None and not _marked(self.state),
                       max(0.0, since + seconds - time.monotonic()), interval=0.2,
                       what="the demo and every process it started gone")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still there: {_marked(self.state)}\n{self.output()}") from None
        return int(self.proc.returncode)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def cleanup(state: Path, *demos: Demo) -> Iterator[None]:
    """Whatever a failed test leaves is killed: the next test must not find it."""
    try:
        yield
    finally:
        for demo in demos:
            demo.kill()
        for proc in _marked(state):
            with suppress(psutil.Error):
                proc.kill()


def _read_until(stream: IO[bytes], marker: bytes, timeout: float) -> bytes:
    """What ``stream`` yields up to and including the line with ``marker``."""
    got = b""
    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    while marker not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout:.0f}s:\n{got.decode(errors='replace')}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"the demo's output ended before {marker!r}:\n{got.decode(errors='replace')}"
            got += chunk
    return got


def _assert_clean_stop(demo: Demo, stop: Callable[[], object]) -> None:
    """``stop`` (a signal, a closed pipe) ends the demo: exit 0, every process gone within STOPPED_WITHIN of it,
    the timeline written."""
    since = time.monotonic()
    stop()
    assert demo.stopped_within(STOPPED_WITHIN, since) == 0, demo.output()
    assert (demo.state / "timeline.json").exists(), demo.output()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_stops_every_process_and_writes_the_timeline(tmp_path: Path, sig: signal.Signals) -> None:
    state = tmp_path / "state"
    demo = Demo(tmp_path, state, *MINIMAL)
    with cleanup(state, demo):
        demo.wait_up()
        assert len(_marked(state)) >= 3  # the control plane, the agent, its engine
        _assert_clean_stop(demo, partial(demo.proc.send_signal, sig))
        assert "every process stopped" in demo.output()


def test_its_stdout_reader_gone_stops_the_demo_which_finishes_into_its_log(tmp_path: Path) -> None:
    """`make demo | tee demo.log` with tee killed: nothing is printed meanwhile, yet the demo notices."""
    state = tmp_path / "state"
    demo = Demo(tmp_path, state, *MINIMAL, pipe=True)
    with cleanup(state, demo):
        assert demo.proc.stdout is not None
        _read_until(demo.proc.stdout, b"Ctrl-C stops everything", UP_TIMEOUT)
        _assert_clean_stop(demo, demo.proc.stdout.close)
        log = (state / "demo" / "logs" / "demo.log").read_text()
        assert "every process stopped" in log, log


def test_a_demo_whose_reader_goes_before_it_is_up_still_stops_everything_and_writes_the_timeline(
        tmp_path: Path) -> None:
    """`pitstop demo | head -1`: the reader is gone after the first line, long before the fleet is up."""
    state = tmp_path / "state"
    demo = Demo(tmp_path, state, *MINIMAL, pipe=True)
    with cleanup(state, demo):
        assert demo.proc.stdout is not None
        _read_until(demo.proc.stdout, b"\n", UP_TIMEOUT)
        _assert_clean_stop(demo, demo.proc.stdout.close)
        # Written even so, saying whether Pitstop's side could be read (it usually was not up yet).
        assert "control_plane" in json.loads((state / "timeline.json").read_text())


def test_sighup_stops_the_whole_fleet(tmp_path: Path) -> None:
    """Everything the demo starts: four engines, the console, the load, Prometheus and Alertmanager when they
    are installed."""
    state = tmp_path / "state"
    demo = Demo(tmp_path, state, "--calm")
    with cleanup(state, demo):
        urls = demo.wait_up()
        monitoring = [name for name in ("prometheus", "alertmanager") if urls.get(name)]
        if shutil.which("prometheus"):
            assert "prometheus" in monitoring, demo.output()
        # control plane and its policy process, agent, four engines, console, load, and the monitoring
        assert len(_marked(state)) >= 9 + len(monitoring), _marked(state)
        _assert_clean_stop(demo, partial(demo.proc.send_signal, signal.SIGHUP))


def test_a_second_demo_names_the_first_and_replace_takes_over(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = Demo(tmp_path, state, *MINIMAL, name="first")
    with cleanup(state, first):
        urls = first.wait_up()
        first_fleet = _marked(state)
        second = Demo(tmp_path, state, *MINIMAL, name="second")
        assert second.proc.wait(timeout=60) == 2, second.output()
        said = second.output()
        assert f"pid {first.proc.pid}" in said and urls["api"] in said, said
        assert first.proc.poll() is None  # untouched

        third = Demo(tmp_path, state, "--replace", *MINIMAL, name="third")
        with cleanup(state, third):
            # The first demo is stopped as by SIGTERM, in order, before the third starts its fleet.
            wait_until(lambda: first.proc.poll() is not None, 60, interval=0.2, what="the first demo to stop")
            assert first.proc.returncode == 0, first.output()
            assert "every process stopped" in first.output(), first.output()
            assert not _alive(first_fleet)
            assert third.wait_up()["pid"] == third.proc.pid
            _assert_clean_stop(third, partial(third.proc.send_signal, signal.SIGINT))


def test_what_a_sigkilled_demo_left_is_stopped_by_the_next(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = Demo(tmp_path, state, *MINIMAL, name="first")
    with cleanup(state, first):
        first.wait_up()
        first.kill()  # no chance to clean up: its fleet runs on, unowned
        orphans = _marked(state)
        assert len(orphans) >= 3
        second = Demo(tmp_path, state, *MINIMAL, name="second")
        with cleanup(state, second):
            urls = second.wait_up()
            assert "processes an earlier demo left running" in second.output(), second.output()
            assert not _alive(orphans)
            assert urls["pid"] == second.proc.pid
            _assert_clean_stop(second, partial(second.proc.send_signal, signal.SIGINT))


def _first_bindable(port: int) -> int:
    while not bindable(port):
        port += 1
    return port


def _listen(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, port))
    s.listen()
    return s


def test_a_port_held_by_another_process_is_never_reported_as_the_demos(tmp_path: Path) -> None:
    """Listeners on the very ports the demo would pick: the API's on 127.0.0.1, the agent's on [::1] only
    (127.0.0.1 stays bindable there, yet localhost may reach it), the replica's on every address."""
    held = []
    api_port = _first_bindable(8000)
    held.append(_listen(socket.AF_INET, "127.0.0.1", api_port))
    agent_port = _first_bindable(9400)
    with suppress(OSError):  # no IPv6 here: that case cannot happen either
        held.append(_listen(socket.AF_INET6, "::1", agent_port))
    replica_port = _first_bindable(8101)
    held.append(_listen(socket.AF_INET, "0.0.0.0", replica_port))
    foreign = {s.getsockname()[1] for s in held}
    state = tmp_path / "state"
    demo = Demo(tmp_path, state, *MINIMAL)
    try:
        with cleanup(state, demo):
            urls = demo.wait_up()
            reported = [urls["api"], urls["agent"], *urls["replicas"]]
            assert not [u for u in reported if int(u.rsplit(":", 1)[1]) in foreign], (foreign, reported)
            printed = demo.output()
            assert not [p for p in foreign if f":{p}" in printed], (foreign, printed)
            _assert_clean_stop(demo, partial(demo.proc.send_signal, signal.SIGINT))
    finally:
        for s in held:
            s.close()
