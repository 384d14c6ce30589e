"""A node gone dark pages on-call by itself, and the page resolves when the node reports again.

A real ``pitstop server`` runs the shipped ``node-unreachable`` policy (its ``for:`` cut from 60 s to 4 s) and
sends to four receivers on loopback, one per format; a real ``pitstop agent`` supervises two simulated engines
of two models. The agent is killed with SIGKILL, as a host that loses power would leave it: no goodbye, its
engines serving on without it. Every receiver gets a page naming the node, when it was last heard and what it
runs, and one per model the node's silence left below its disruption budget; a new agent adopts the engines,
reports, and every receiver gets the resolves. The node's own unreachability, which inhibits its replica
alerts, never mutes these pages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness.http import probe
from controlplane.policy_files import DEFAULTS_DIR
from tests.helpers import free_port, http_ok, wait_until
from tests.notify.receiving import Receiving, said
from tests.observability.conftest import StackProcesses

pytestmark = pytest.mark.slow

NODE = "dark-node"
RECEIVERS = ("am", "pager", "chat", "signed")
FOR_SECONDS = 4


def _policy_dir(tmp: Path) -> Path:
    """The shipped policy, only its for: cut."""
    policy = yaml.safe_load((DEFAULTS_DIR / "node-unreachable.yaml").read_text())
    policy["condition"]["for"] = f"{FOR_SECONDS}s"
    out = tmp / "policies"
    out.mkdir()
    (out / "node-unreachable.yaml").write_text(yaml.safe_dump(policy))
    return out


def _start_server(tmp: Path, processes: StackProcesses, hooks: dict[str, Receiving]) -> str:
    port = free_port()
    (tmp / "pd-key").write_text("R0UTINGKEYdark0123456789abcdef01\n")
    (tmp / "hmac").write_text("hmac-secret-dark\n")
    config = tmp / "server.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "database_url": f"sqlite:///{tmp / 'cp.db'}", "policy_defaults": False,
        "policy_dirs": [str(_policy_dir(tmp))], "policy_interval_seconds": 1, "notify_interval_seconds": 0.5,
        "stale_after_seconds": 2, "external_url": "https://pitstop.example.internal",
        "notifier": {
            "receivers": [
                {"name": "am", "alertmanager_webhook": {"url": hooks["am"].url}},
                {"name": "pager", "pagerduty": {"url": hooks["pager"].url, "routing_key_file": str(tmp / "pd-key")}},
                {"name": "chat", "slack": {"webhook_url": hooks["chat"].url}},
                {"name": "signed", "webhook": {"url": hooks["signed"].url, "hmac_secret_file": str(tmp / "hmac")}},
            ],
            # The product's default grouping: the node's page apart from each model's.
            "route": {"receiver": "am", "group_by": ["model", "node"], "group_wait": "0s", "group_interval": "1s",
                      "repeat_interval": "4h", "routes": [{"receiver": name, "continue": True} for name in RECEIVERS]},
        },
    }))
    server = processes.start("server", "server", "--config", str(config))
    cp = f"http://127.0.0.1:{port}"
    processes.wait_serving(server, f"{cp}/healthz", 60)
    return cp


def _agent_config(tmp: Path, cp: str) -> tuple[Path, str]:
    port = free_port()
    sim = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp / "simgpu")]
    config = tmp / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": NODE, "port": port, "control_plane": cp, "report_interval": 0.5, "scrape_interval": 0.5,
        "gpu_backend": "sim", "sim_gpu_count": 2, "sim_gpu_dir": str(tmp / "simgpu"),
        "state_dir": str(tmp / "agent-state"),
        "replicas": [{"name": "chat-0", "model": "chat", "port": free_port(), "gpus": [0], "args": sim},
                     {"name": "code-0", "model": "code", "port": free_port(), "gpus": [1], "args": sim}],
    }))
    return config, f"http://127.0.0.1:{port}"



def _bodies(hook: Receiving, name: str, status: str) -> list[dict[str, Any]]:
    return [b for b in list(hook.bodies) if said(name, b) == status]


def _text(name: str, body: dict[str, Any]) -> str:
    """What on-call reads in one body: the alerts' summaries, or the chat message."""
    if name == "pager":
        return str(body["payload"]["summary"])
    if name == "chat":
        return str(body["text"])
    return " ".join(str(a["annotations"].get("summary", "")) for a in body["alerts"])


def _engine_pids(agent: str) -> list[int]:
    replicas = probe.get(f"{agent}/v1/replicas", timeout=5).json()
    return [r["process"]["pid"] for r in replicas if r.get("process")]


def test_a_killed_agent_pages_every_receiver_with_what_its_node_runs_and_the_next_agent_resolves_it(
        tmp_path: Path) -> None:
    processes = StackProcesses(tmp_path / "logs")
    hooks = {"am": Receiving(default=200), "pager": Receiving(default=202), "chat": Receiving(default=200),
             "signed": Receiving(default=200)}
    engines: list[int] = []
    try:
        cp = _start_server(tmp_path, processes, hooks)
        config, agent = _agent_config(tmp_path, cp)
        first = processes.start("agent", "agent", "--config", str(config))
        processes.wait_serving(first, f"{agent}/healthz", 60)
        wait_until(lambda: all(http_ok(f"{agent}/v1/replicas/{r}/ready", timeout=3) for r in ("chat-0", "code-0")),
                   60, what="both replicas READY")
        engines = _engine_pids(agent)
        wait_until(lambda: probe.get(f"{cp}/v1/nodes/{NODE}", timeout=5).status_code == 200, 30,
                   what="the node known to the control plane")
        assert not any(hook.bodies for hook in hooks.values())  # a reporting node pages nobody

        pid = first.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the host gone dark, as far as the control plane can tell
        killed = time.monotonic()
        wait_until(lambda: all(_bodies(hooks[n], n, "firing") for n in RECEIVERS), 60, interval=0.2,
                   what=f"the page at every receiver\n{processes.log('server')[-3000:]}")
        paged = time.monotonic() - killed
        # Not before the node had been silent for the policy's for:, on the control plane's clock: silence begins
        # at its last report, which came before the kill (by up to a report interval, longer on a busy host), so
        # the time from the kill alone may be shorter.
        heard = datetime.fromisoformat(probe.get(f"{cp}/v1/nodes/{NODE}", timeout=5).json()["last_report_at"])
        fired = [datetime.fromisoformat(a["starts_at"]) for a in probe.get(f"{cp}/v1/alerts", timeout=5).json()
                 if a["policy"] == "node-unreachable" and a["labels"].get("target") == f"node:{NODE}"]
        assert fired and (fired[0] - heard).total_seconds() >= FOR_SECONDS, (fired, heard, paged)
        # The node's page, and one per model its silence left below the disruption budget (each model had its
        # only replica there).
        wanted = (f"node {NODE} unreachable", "chat: chat-0 here, 1 of its 1 replicas unaccounted for",
                  "code: code-0 here", "model chat below its disruption budget", "model code below")
        wait_until(lambda: all(w in " ".join(_text(n, b) for b in _bodies(hooks[n], n, "firing"))
                               for n in RECEIVERS for w in wanted), 30, interval=0.2, what="every page everywhere")
        alerts = {a["labels"]["target"]: a for b in hooks["am"].bodies for a in b["alerts"]}
        assert set(alerts) == {f"node:{NODE}", "model:chat", "model:code"}
        node_page = alerts[f"node:{NODE}"]["labels"]
        assert node_page["alertname"] == "pitstop-node-unreachable" and node_page["node"] == NODE
        assert node_page["severity"] == "page" and alerts["model:chat"]["labels"]["model"] == "chat"
        assert all(b["payload"]["severity"] == "critical" for b in hooks["pager"].bodies)
        # Its engines served on without the agent.
        assert all(http_ok(f"http://127.0.0.1:{p}/health", timeout=3) for p in _ports(config))

        second = processes.start("agent-2", "agent", "--config", str(config))
        processes.wait_serving(second, f"{agent}/healthz", 60)
        wait_until(lambda: all(len(_bodies(hooks[n], n, "resolved")) == len(_bodies(hooks[n], n, "firing"))
                               for n in RECEIVERS), 60, interval=0.2,
                   what=f"the resolves at every receiver\n{processes.log('server')[-3000:]}")
        # The new agent adopted the engines it found: nothing was restarted to bring the node back.
        assert sorted(_engine_pids(agent)) == sorted(engines)
        rows = [a for a in probe.get(f"{cp}/v1/alerts", timeout=5).json() if a["policy"] == "node-unreachable"]
        assert len(rows) == 3 and all(a["state"] == "resolved" for a in rows), rows
    finally:
        processes.stop_all()
        for pid in engines:  # never leave an engine behind a failed test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for hook in hooks.values():
            hook.close()


def _ports(config: Path) -> list[int]:
    return [int(r["port"]) for r in yaml.safe_load(config.read_text())["replicas"]]
