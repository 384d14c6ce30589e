"""A real control plane and a real agent supervising simulated engines, and the API calls benchmarks make.

``Fleet.start`` writes both configs into a temporary folder, starts ``pitstop server`` (SQLite) and
``pitstop agent`` with simulated GPUs, and waits until the agent's node has reported. Server settings the
running version does not know (the policy loop's, while it lands) are left out rather than failing the run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness.procs import Processes, free_port, http_ok, wait_until
from controlplane.config import ServerConfig

NODE = "bench-node"


@dataclass
class Replica:
    """One simulated engine the agent supervises."""

    name: str
    args: list[str] = field(default_factory=list)
    gpu: int = 0
    model: str = "bench-model"
    env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # any other agent replica setting
    port: int = field(default_factory=free_port)

    def agent_entry(self, sim_gpu_dir: Path) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "port": self.port, "gpus": [self.gpu],
                "args": ["--sim-gpu-dir", str(sim_gpu_dir), *self.args], "env": self.env, **self.extra}


def server_config(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without the settings this control plane does not have (reported on stderr)."""
    known = set(ServerConfig.model_fields)
    dropped = sorted(set(values) - known)
    if dropped:
        print(f"note: this control plane has no setting {', '.join(dropped)}; left out", flush=True)
    return {k: v for k, v in values.items() if k in known}


@dataclass
class Fleet:
    """A control plane URL, an agent URL and the replicas the agent runs."""

    cp: str
    agent: str
    replicas: list[Replica]
    tmp: Path
    client: httpx.Client
    database_url: str

    @classmethod
    def start(cls, tmp: Path, processes: Processes, replicas: list[Replica], *, server: dict[str, Any] | None = None,
              agent: dict[str, Any] | None = None, gpus: int | None = None) -> Fleet:
        tmp.mkdir(parents=True, exist_ok=True)
        cp_port, agent_port = free_port(), free_port()
        settings = {"port": cp_port, "database_url": f"sqlite:///{tmp / 'cp.db'}",
                    "executor_interval_seconds": 0.5, "report_interval_seconds": 1.0, **(server or {})}
        (tmp / "server.yaml").write_text(yaml.safe_dump(server_config(settings)))
        processes.start("server", "server", "--config", str(tmp / "server.yaml"), "--log-level", "warning")
        cp = f"http://127.0.0.1:{cp_port}"
        wait_until(lambda: http_ok(f"{cp}/healthz"), 60, what="the control plane")
        sim_gpu_dir = tmp / "simgpu"
        # A canary with every 1 s scrape, as the fault benchmarks were measured: at 1 s windows a slow, lightly
        # loaded engine's TTFT window is often empty but for the canary's own first token. The shipped ttft-slo
        # policy counts only windows with a reading (over 500 ms in half of them), so the canary keeps each
        # window's reading about the engine rather than missing.
        config = {"node": NODE, "port": agent_port, "control_plane": cp, "report_interval": 1.0,
                  "scrape_interval": 1.0, "canary_interval": 1.0, "process_interval": 2.0, "gpu_backend": "sim",
                  "sim_gpu_count": gpus or max(r.gpu for r in replicas) + 1, "sim_gpu_dir": str(sim_gpu_dir),
                  "state_dir": str(tmp / "agent-state"),
                  "replicas": [r.agent_entry(sim_gpu_dir) for r in replicas], **(agent or {})}
        (tmp / "agent.yaml").write_text(yaml.safe_dump(config))
        processes.start("agent", "agent", "--config", str(tmp / "agent.yaml"))
        url = f"http://127.0.0.1:{agent_port}"
        wait_until(lambda: http_ok(f"{url}/healthz"), 60, what="the agent")
        fleet = cls(cp=cp, agent=url, replicas=replicas, tmp=tmp, client=httpx.Client(timeout=10),
                    database_url=settings["database_url"])
        return fleet

    # -- reads -------------------------------------------------------------------------------------------
    def agent_replica(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.client.get(f"{self.agent}/v1/replicas/{name}").json()
        return body

    def ready(self, name: str) -> bool:
        try:
            return self.client.get(f"{self.agent}/v1/replicas/{name}/ready", timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_all_ready(self, timeout: float = 90) -> None:
        try:
            wait_until(lambda: all(self.ready(r.name) for r in self.replicas), timeout, what="every replica READY")
        except TimeoutError as exc:
            states = {r.name: self.agent_replica(r.name).get("state") for r in self.replicas}
            raise TimeoutError(f"{exc}; agent says {states}") from exc
        # ... and the control plane has heard so (the guardrails read readiness from its store).
        wait_until(lambda: sum(1 for r in self.cp_replicas() if r["ready"]) == len(self.replicas), 30,
                   what="the control plane sees every replica READY")

    def cp_replicas(self) -> list[dict[str, Any]]:
        body: list[dict[str, Any]] = self.client.get(f"{self.cp}/v1/replicas").json()
        return body

    def actions(self, **params: str) -> list[dict[str, Any]]:
        body: list[dict[str, Any]] = self.client.get(f"{self.cp}/v1/actions", params={"limit": "500", **params}).json()
        return body

    def action(self, action_id: int) -> dict[str, Any]:
        body: dict[str, Any] = self.client.get(f"{self.cp}/v1/actions/{action_id}").json()
        return body

    def events(self, replica: str) -> list[dict[str, Any]]:
        body: list[dict[str, Any]] = self.client.get(
            f"{self.cp}/v1/events", params={"node": NODE, "replica": replica, "limit": "500"}).json()
        return body

    # -- writes ------------------------------------------------------------------------------------------
    def act(self, replica: str, kind: str = "restart", **body: Any) -> dict[str, Any]:
        response = self.client.post(f"{self.cp}/v1/replicas/{NODE}/{replica}/actions",
                                    json={"kind": kind, "reason": "benchmark", **body})
        response.raise_for_status()
        out: dict[str, Any] = response.json()
        return out

    def wait_action(self, action_id: int, timeout: float = 120) -> dict[str, Any]:
        """Poll one action until it leaves approved/running; returns its final record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            action = self.action(action_id)
            if action["state"] not in ("approved", "running", "proposed"):
                return action
            time.sleep(0.25)
        raise TimeoutError(f"action {action_id} still {action['state']} after {timeout:g} s")


def wall(ts: str) -> float:
    """An API timestamp (ISO 8601 with a zone) as seconds since the epoch."""
    return datetime.fromisoformat(ts).timestamp()


class ListenWatch:
    """When each engine port first answers /health, to 50 ms: the simulator's timed faults count from then."""

    def __init__(self, ports: dict[str, int], timeout: float = 120.0) -> None:
        self.first: dict[str, float] = {}
        self._ports = ports
        self._deadline = time.monotonic() + timeout
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=0.5) as client:
            while len(self.first) < len(self._ports) and time.monotonic() < self._deadline:
                for name, port in self._ports.items():
                    if name in self.first:
                        continue
                    try:
                        if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                            self.first[name] = time.time()
                    except httpx.HTTPError:
                        pass
                time.sleep(0.05)
