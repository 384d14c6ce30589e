"""End to end: a real ``pitstop server`` and a real ``pitstop agent`` with simulated engines.

One engine wedges five seconds after it starts (``--fault-hang-after 5``: /health stays 200, no token moves)
while requests wait on it. The control plane's own policy job must see the stall, restart the replica through
the agent, and record the restart as succeeded once the replica is READY at its new generation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from agent.stackdump import find_py_spy
from bench.harness.http import probe
from tests.helpers import SteadyTraffic, free_port, http_ok, wait_until
from tests.integration.conftest import Processes

pytestmark = pytest.mark.slow

STALL = {"name": "stall", "condition": {"detector": "stall", "for": "4s"}, "action": {"kind": "restart"},
         "guardrails": {"cooldown": "10m"}}


def _start(tmp: Path, processes: Processes) -> tuple[str, str, int]:
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "stall.yaml").write_text(yaml.safe_dump(STALL))
    cp_port, agent_port, wedged_port = free_port(), free_port(), free_port()
    server = tmp / "server.yaml"
    server.write_text(yaml.safe_dump({
        "port": cp_port, "database_url": f"sqlite:///{tmp / 'cp.db'}", "policy_defaults": False,
        "policy_dirs": [str(policies)], "policy_interval_seconds": 1, "executor_interval_seconds": 0.5,
        "action_deadline_seconds": 60}))
    processes.start("server", "server", "--config", str(server))
    cp = f"http://127.0.0.1:{cp_port}"
    wait_until(lambda: http_ok(f"{cp}/healthz"), 60, what="the control plane")
    sim = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp / "simgpu")]
    agent_config = tmp / "agent.yaml"
    agent_config.write_text(yaml.safe_dump({
        "node": "e2e", "port": agent_port, "control_plane": cp, "report_interval": 1, "scrape_interval": 0.5,
        "canary_every": 2, "canary_timeout": 2, "gpu_backend": "sim", "sim_gpu_count": 2,
        "sim_gpu_dir": str(tmp / "simgpu"), "state_dir": str(tmp / "agent-state"),
        "replicas": [{"name": "wedged", "model": "tiny", "port": wedged_port, "gpus": [0],
                      "args": [*sim, "--fault-hang-after", "5"], "stop_timeout": 5, "drain_timeout": 2}],
    }))
    processes.start("agent", "agent", "--config", str(agent_config))
    agent = f"http://127.0.0.1:{agent_port}"
    wait_until(lambda: http_ok(f"{agent}/healthz"), 60, what="the agent")
    return cp, agent, wedged_port


def _restarts(cp: str) -> list[dict[str, Any]]:
    try:
        rows: list[dict[str, Any]] = probe.get(f"{cp}/v1/actions", params={"policy": "stall"}, timeout=5).json()
    except httpx.HTTPError:
        return []
    return [a for a in rows if a["kind"] == "restart"]


def test_a_wedged_engine_is_restarted_by_the_loop_and_ready_again(tmp_path: Path) -> None:
    processes = Processes(tmp_path / "logs")
    try:
        cp, agent, port = _start(tmp_path, processes)
        wait_until(lambda: http_ok(f"{agent}/v1/replicas/wedged/ready"), 60, what="the replica READY")
        with SteadyTraffic(port, every=0.5, timeout=15):
            wait_until(lambda: _restarts(cp) != [], 60, what="the stall detected and a restart recorded")
        wait_until(lambda: _restarts(cp)[-1]["state"] in ("succeeded", "failed"), 60,
                   what="the restart's outcome")
        restart = _restarts(cp)[-1]
        assert restart["state"] == "succeeded", (restart, processes.log("server")[-3000:])
        assert restart["target"] == "replica:e2e/wedged"
        assert restart["evidence"][0]["detector"] == "stall"
        captured = restart["params"]["captured"]["e2e/wedged"]
        assert "log_tail" in captured
        if find_py_spy() is not None:  # the agent finds py-spy beside its Python (the venv's bin)
            assert captured["stack_dump_note"].startswith("captured by py-spy "), captured["stack_dump_note"]
            assert "main (enginesim/cli.py:" in captured["stack_dump"]  # the wedged engine's own frames
        else:
            assert captured["stack_dump_note"].startswith("no stack dump: py-spy not installed on node e2e")
        replica = probe.get(f"{cp}/v1/replicas/e2e/wedged", timeout=5).json()
        assert replica["generation"] >= restart["params"]["applied"]["e2e/wedged"]
    finally:
        processes.stop_all()
