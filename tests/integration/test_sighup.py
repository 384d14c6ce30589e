"""SIGHUP (the terminal closed) stops `pitstop server` and `pitstop agent` as SIGTERM does, and neither leaves a
child it owns without an owner: the server's policy process ends with it, even when the server is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from bench.harness.http import probe
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import free_port, http_ok, wait_until

pytestmark = pytest.mark.slow

PITSTOP = [sys.executable, "-m", "pitstop.cli"]


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], list[psutil.Process], Path]]:
    """`pitstop server` up, with its children (the policy process among them)."""
    port = free_port()
    log = tmp_path / "server.log"
    # Rounds far apart: the policy process waits between them, and must end with its parent all the same.
    config = {"port": port, "database_url": f"sqlite:///{tmp_path / 'pitstop.db'}", "policy_interval_seconds": 600}
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(config))
    children: list[psutil.Process] = []
    with log.open("wb") as out:
        proc = subprocess.Popen([*PITSTOP, "server", "--config", str(tmp_path / "server.yaml")], cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is not None or http_ok(f"http://127.0.0.1:{port}/readyz"), 60,
                   what="pitstop server")
        assert proc.poll() is None, log.read_text()

        def policy_process() -> bool:
            return any("multiprocessing.spawn" in " ".join(c.cmdline()) for c in _alive(_children(proc.pid)))

        wait_until(policy_process, 30, what="the policy process")
        children = _children(proc.pid)
        yield proc, children, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for child in _alive(children):  # a failed test leaves nothing behind
            child.kill()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def test_server_stops_on_sighup_as_on_sigterm_with_its_policy_process(
        server: tuple[subprocess.Popen[bytes], list[psutil.Process], Path]) -> None:
    proc, children, log = server
    proc.send_signal(signal.SIGHUP)
    # uvicorn re-raises the SIGTERM it shut down on: the status says SIGTERM, the log an orderly shutdown.
    assert proc.wait(timeout=60) == -signal.SIGTERM, log.read_text()
    assert "Application shutdown complete" in log.read_text()
    wait_until(lambda: not _alive(children), 15, what=f"the server's children gone: {_alive(children)}")


def _rounds(url: str) -> float:
    for line in probe.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("pitstop_cp_policy_round_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def test_server_killed_with_sigkill_leaves_no_policy_process(
        server: tuple[subprocess.Popen[bytes], list[psutil.Process], Path], tmp_path: Path) -> None:
    proc, children, _ = server
    url = f"http://127.0.0.1:{yaml.safe_load((tmp_path / 'server.yaml').read_text())['port']}"
    # A report pokes the policy process: once its round is counted it is back in its wait, ten minutes long.
    r = report(replicas=[replica("chat-0")], sent_at=datetime.now(UTC))
    assert probe.post(f"{url}/v1/agents/gpu-a/report", json=body(r), timeout=10).status_code == 200
    wait_until(lambda: _rounds(url) >= 1, 30, interval=0.3, what="a policy round")
    proc.kill()  # no shutdown at all: the policy process must notice by itself
    proc.wait()
    wait_until(lambda: not _alive(children), 15, what=f"the server's children gone: {_alive(children)}")


def test_agent_stops_on_sighup_as_on_sigterm_engines_drained_and_stopped(tmp_path: Path) -> None:
    port = free_port()
    replica: dict[str, Any] = {"name": "r1", "model": "tiny", "port": free_port(), "start_timeout": 60,
                               "args": ["--sim-startup-seconds", "0.5", "--shutdown-timeout", "2"],
                               "drain_grace": 0.5, "drain_timeout": 5, "stop_timeout": 5,
                               "warmup": {"requests": 1, "max_tokens": 4}}
    config = {"node": "test-node", "port": port, "control_plane": None, "gpu_backend": "sim",
              "sim_gpu_dir": str(tmp_path / "simgpu"), "state_dir": str(tmp_path / "state"),
              "scrape_interval": 0.5, "replicas": [replica]}
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "agent.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
    with log.open("wb") as out:
        agent = subprocess.Popen([*PITSTOP, "agent", "--config", str(tmp_path / "agent.yaml")], env=env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    engine: psutil.Process | None = None
    try:
        def ready() -> bool:
            try:
                replicas = probe.get(f"{url}/v1/replicas", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return agent.poll() is not None
            return bool(replicas and replicas[0]["state"] == "READY")

        wait_until(ready, 90, interval=0.3, what="the replica READY")
        assert agent.poll() is None, log.read_text()
        engine = psutil.Process(probe.get(f"{url}/v1/replicas", timeout=5).json()[0]["process"]["pid"])
        agent.send_signal(signal.SIGHUP)
        assert agent.wait(timeout=60) == 0, log.read_text()
        # As on SIGTERM: the engine was drained and stopped before the agent exited, not left to be adopted.
        assert not _alive([engine]), log.read_text()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if engine is not None and _alive([engine]):
            os.killpg(engine.pid, signal.SIGKILL)
