"""Fixtures for the agent's slow tests: a real agent process, and a control-plane stand-in that records reports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import uvicorn
import yaml
from fastapi import FastAPI, Request

from agent.wire import DesiredState, NodeReport
from bench.harness.http import probe
from tests.helpers import free_port, http_ok, wait_until

REPO = Path(__file__).resolve().parents[2]


class AgentProcess:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self.engine_pids: set[int] = set()

    def replicas(self) -> list[dict[str, Any]]:
        try:
            return list(probe.get(f"{self.url}/v1/replicas", timeout=5).json())
        except httpx.TimeoutException as exc:  # the agent's loop held up: what it was doing is in its log
            raise AssertionError(f"the agent did not answer GET /v1/replicas within 5 s ({exc!r}); "
                                 f"alive: {self.proc.poll() is None}\n{self.output()}") from exc

    def replica(self, name: str) -> dict[str, Any]:
        found = next(r for r in self.replicas() if r["name"] == name)
        if found.get("process") and found["process"].get("pid"):
            self.engine_pids.add(found["process"]["pid"])
        return found

    def wait_state(self, name: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
        wait_until(lambda: self.replica(name)["state"] == state, timeout, what=f"{name} {state}\n{self.output()}")
        return self.replica(name)

    def output(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(replicas: list[dict[str, Any]], **settings: Any) -> AgentProcess:
        port = free_port()
        config = {"node": "test-node", "port": port, "control_plane": None, "gpu_backend": "sim",
                  "sim_gpu_dir": str(tmp_path / "simgpu"), "state_dir": str(tmp_path / "state"),
                  "scrape_interval": 0.5, "report_interval": 0.5, "backoff": {"base": 0.2, "cap": 1.0},
                  "replicas": replicas, **settings}
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        log = tmp_path / "agent.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
        proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "agent", "--config", str(path)], cwd=REPO,
                                env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        agent = AgentProcess(proc, f"http://127.0.0.1:{port}", log)
        started.append(agent)
        wait_until(lambda: http_ok(f"{agent.url}/healthz") or proc.poll() is not None, 20, what="agent /healthz")
        assert proc.poll() is None, agent.output()
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.send_signal(signal.SIGTERM)
            try:
                agent.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.proc.kill()
                agent.proc.wait()
        for pid in agent.engine_pids:  # belt and braces: never leave an engine behind a failed test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def group_alive(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


class ControlPlaneStandIn:
    """Records every report; answers with ``self.desired`` (settable by the test)."""

    def __init__(self) -> None:
        self.reports: list[NodeReport] = []
        self.auth: list[str | None] = []
        self.desired = DesiredState(node="test-node")
        self.app = FastAPI()

        @self.app.post("/v1/agents/{node}/report")
        async def report(node: str, request: Request) -> dict[str, Any]:
            self.reports.append(NodeReport.model_validate_json(await request.body()))
            self.auth.append(request.headers.get("authorization"))
            return self.desired.model_dump(mode="json")


@pytest.fixture
def control_plane() -> Iterator[tuple[ControlPlaneStandIn, str]]:
    stand_in = ControlPlaneStandIn()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(stand_in.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, what="control-plane stand-in")
    try:
        yield stand_in, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
