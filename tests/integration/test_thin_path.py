"""The whole thin path on loopback: simulator engines, an agent supervising them, the control plane seeing them."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.harness.http import probe
from tests.helpers import free_port, http_ok, wait_until
from tests.integration.conftest import Processes

pytestmark = pytest.mark.slow

TOKEN = "integration-agent-token"
VIEWER = "integration-viewer-token"
READ = {"Authorization": f"Bearer {VIEWER}"}


def _replicas(url: str) -> list[dict[str, Any]]:
    try:
        data = probe.get(url, headers=READ, timeout=3).json()
    except (httpx.HTTPError, ValueError):
        return []
    return data if isinstance(data, list) else data.get("replicas", data.get("items", []))


def _start_fleet(tmp_path: Path, processes: Processes, replicas: int) -> tuple[str, str, list[int]]:
    api_port, agent_port = free_port(), free_port()
    engine_ports = [free_port() for _ in range(replicas)]
    server_cfg = tmp_path / "server.yaml"
    server_cfg.write_text(
        yaml.safe_dump(
            {
                "port": api_port,
                "database_url": f"sqlite:///{tmp_path / 'fleet.db'}",
                "agent_tokens": [TOKEN],
                "viewer_tokens": [VIEWER],
            }
        )
    )
    agent_cfg = tmp_path / "agent.yaml"
    agent_cfg.write_text(
        yaml.safe_dump(
            {
                "node": "it-node",
                "port": agent_port,
                "control_plane": f"http://127.0.0.1:{api_port}",
                "token": TOKEN,
                "report_interval": 0.5,
                "scrape_interval": 0.5,
                "gpu_backend": "sim",
                "sim_gpu_count": replicas,
                "sim_gpu_dir": str(tmp_path / "simgpu"),
                "state_dir": str(tmp_path / "agent-state"),
                "backoff": {"base": 0.5, "cap": 2.0},
                "replicas": [
                    {
                        "name": f"r{i}",
                        "model": "tiny",
                        "port": port,
                        "gpus": [i],
                        "args": ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp_path / "simgpu")],
                        "stop_timeout": 5,
                        "drain_timeout": 5,
                    }
                    for i, port in enumerate(engine_ports)
                ],
            }
        )
    )
    processes.start("server", "server", "--config", str(server_cfg))
    api = f"http://127.0.0.1:{api_port}"
    wait_until(lambda: http_ok(f"{api}/healthz"), 60, what="the control plane")
    processes.start("agent", "agent", "--config", str(agent_cfg))
    agent = f"http://127.0.0.1:{agent_port}"
    wait_until(lambda: http_ok(f"{agent}/healthz"), 60, what="the agent")
    return api, agent, engine_ports


def test_agent_supervises_simulated_replicas_and_the_control_plane_sees_them(
    tmp_path: Path, processes: Processes
) -> None:
    api, agent, engine_ports = _start_fleet(tmp_path, processes, replicas=2)

    def all_ready_in_control_plane() -> bool:
        rows = _replicas(f"{api}/v1/replicas")
        return len(rows) == 2 and all(r.get("state") == "READY" for r in rows)

    wait_until(all_ready_in_control_plane, 90, what="two READY replicas in the control plane")
    for name in ("r0", "r1"):
        assert probe.get(f"{agent}/v1/replicas/{name}/ready", timeout=3).status_code == 200

    nodes = probe.get(f"{api}/v1/nodes", headers=READ, timeout=3).json()
    nodes = nodes if isinstance(nodes, list) else nodes.get("nodes", [])
    assert [n["name"] for n in nodes] == ["it-node"]
    # The agent reports its host's memory: the limit the leak detector projects an engine's RSS against.
    assert nodes[0]["memory_total_bytes"] > 2**30

    # Traffic through one engine shows up as engine figures in the control plane.
    for _ in range(3):
        r = probe.post(
            f"http://127.0.0.1:{engine_ports[0]}/v1/completions",
            json={"model": "tiny", "prompt": "hello there", "max_tokens": 8},
            timeout=30,
        )
        assert r.status_code == 200

    def gpus_reported() -> bool:
        gpus = probe.get(f"{api}/v1/gpus", headers=READ, timeout=3).json()
        gpus = gpus if isinstance(gpus, list) else gpus.get("gpus", [])
        return len(gpus) == 2 and all(g.get("temperature_celsius") is not None for g in gpus)

    wait_until(gpus_reported, 30, what="two simulated GPUs with temperatures in the control plane")

    # The agent's Prometheus endpoint exports the replica state.
    metrics = probe.get(f"{agent}/metrics", timeout=3).text
    assert 'pitstop_replica_state{' in metrics

    # An engine killed behind the agent's back is restarted and counted.
    pid = next(r["process"]["pid"] for r in _replicas(f"{agent}/v1/replicas") if r["name"] == "r0")
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        row = next((r for r in _replicas(f"{api}/v1/replicas") if r["name"] == "r0"), None)
        return row is not None and row.get("restarts_total", 0) >= 1 and row.get("state") == "READY"

    wait_until(restarted, 90, what="r0 restarted after kill -9 and READY again")
    events = probe.get(f"{api}/v1/events", params={"replica": "r0"}, headers=READ, timeout=3).json()
    events = events if isinstance(events, list) else events.get("events", [])
    assert any(e.get("to_state") == "BACKOFF" for e in events), events
