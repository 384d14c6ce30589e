"""The demo's guards without a fleet: a port is reported only when its own child listens there, one demo holds
a state dir at a time, and a lost stdout is noticed and diverted to the log."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from pitstop import demo_lock
from pitstop.demo_ports import PortNotOurs, check_owner, pick_ports
from pitstop.demo_report import write_timeline
from tests.helpers import free_port, wait_until

# A process that starts a child listening on the port, so the listener is a descendant, not the process itself.
LISTENING_GRANDCHILD = textwrap.dedent("""
    import socket, subprocess, sys
    code = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', %s)); s.listen(); time.sleep(60)"
    subprocess.run([sys.executable, "-c", code % sys.argv[1]])
""")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_port_its_childs_descendant_listens_on_is_its_own() -> None:
    port = free_port()
    child = subprocess.Popen([sys.executable, "-c", LISTENING_GRANDCHILD, str(port)])
    try:
        wait_until(lambda: _listening(port), 30, what="the grandchild listening")
        check_owner("agent", port, child.pid)
    finally:
        for proc in [*psutil.Process(child.pid).children(recursive=True), psutil.Process(child.pid)]:
            proc.kill()
        child.wait()


def test_a_port_another_process_listens_on_is_refused_naming_the_holder() -> None:
    port = free_port()
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", port))
        foreign.listen()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            with pytest.raises(PortNotOurs) as refused:
                check_owner("control plane", port, child.pid)
        finally:
            child.kill()
            child.wait()
    message = str(refused.value)
    assert f"port {port}" in message and f"pid {os.getpid()}" in message, message


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"),
                                         (socket.AF_INET6, "::1")], ids=["127.0.0.1", "0.0.0.0", "::1"])
def test_pick_ports_skips_a_port_held_on_any_address(family: socket.AddressFamily, host: str) -> None:
    port = free_port()
    with socket.socket(family) as foreign:
        if family == socket.AF_INET6:
            foreign.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            foreign.bind((host, port))
        except OSError:
            pytest.skip(f"no {host} here")
        foreign.listen()
        assert port not in pick_ports(port, 2, set())


def test_one_demo_holds_a_state_dir_and_names_its_pid(tmp_path: Path) -> None:
    lock = demo_lock.acquire(tmp_path)
    assert lock is not None
    try:
        assert demo_lock.acquire(tmp_path) is None  # another open of the file: refused as another process is
        assert demo_lock.holder(tmp_path) == os.getpid()
        assert f"pid {os.getpid()}" in demo_lock.describe(tmp_path, os.getpid())
    finally:
        lock.release()
    again = demo_lock.acquire(tmp_path)
    assert again is not None
    again.release()


def test_a_closed_stdout_is_noticed_and_what_follows_goes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from pitstop.demo_output import Output
        out = Output(Path({str(log)!r}))
        out.install()
        print("ready", flush=True)
        while not out.lost():
            time.sleep(0.05)
        print("after", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.stdout.close()
    assert proc.wait(timeout=30) == 0
    assert log.read_text() == "after\nto stderr\n"


def test_a_timeline_without_the_control_plane_is_written_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"
    write_timeline(None, [], None, tmp_path / "no-load.json", out)
    doc = json.loads(out.read_text())
    assert doc["control_plane"] == "the control plane was not up"
    assert doc["load"] is None
