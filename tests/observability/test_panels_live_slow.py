"""Every dashboard panel shows real data: a real Prometheus, configured as alerts/README.md says, scraping a
real control plane, a real agent and its simulated engines (through the agent) under load, with the shipped
rules. Each PromQL expression of each panel runs with the template variables substituted as Grafana would, once
with concrete values and once with "All" (``.*``), and must return at least one series.

One GPU runs hot (so an alert fires and a fault throttle reason is set), one engine logs an XID, and an
operator restarts a replica (so an action reaches its outcome): a panel about alerts, XIDs or Pitstop's actions
has something to show, as on a fleet in trouble.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness.http import probe
from tests.helpers import SteadyTraffic, free_port, http_ok, wait_until
from tests.observability.conftest import StackProcesses
from tests.observability.rules import DASHBOARDS, dashboard_exprs, dashboard_variable_exprs, substitute
from tests.observability.stack import PROMETHEUS, query, shortened_rules, start_prometheus_for_fleet

pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus")]

AGENT_TOKEN, VIEWER, OPERATOR = "agent-secret-token-0", "viewer-secret-token-0", "operator-secret-token-0"
NODE, MODEL = "panels-node", "tiny"


def _start_fleet(tmp: Path, processes: StackProcesses) -> tuple[str, str, list[int]]:
    api_port, agent_port = free_port(), free_port()
    ports = [free_port() for _ in range(3)]
    (tmp / "server.yaml").write_text(yaml.safe_dump({
        "port": api_port, "database_url": f"sqlite:///{tmp / 'fleet.db'}",
        "agent_tokens": [AGENT_TOKEN], "viewer_tokens": [VIEWER], "operator_tokens": [OPERATOR],
        # The faults below are there to be seen on the panels, not remediated away.
        "policies_enabled": False,
    }))
    sim = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp / "simgpu")]
    faults = {"r0": [], "r1": ["--fault-xid-after", "4", "--fault-xid-code", "13"],
              "hot": ["--fault-hot-gpu-after", "3"]}
    (tmp / "agent.yaml").write_text(yaml.safe_dump({
        "node": NODE, "port": agent_port, "control_plane": f"http://127.0.0.1:{api_port}", "token": AGENT_TOKEN,
        "report_interval": 0.5, "scrape_interval": 0.5, "canary_every": 10,
        "gpu_backend": "sim", "sim_gpu_count": 3, "sim_gpu_dir": str(tmp / "simgpu"),
        "state_dir": str(tmp / "agent-state"), "backoff": {"base": 0.5, "cap": 2.0},
        "replicas": [{"name": name, "model": MODEL, "port": port, "gpus": [i], "args": [*sim, *faults[name]],
                      "stop_timeout": 5, "drain_timeout": 2}
                     for i, (name, port) in enumerate(zip(faults, ports, strict=True))],
    }))
    processes.start("server", "server", "--config", str(tmp / "server.yaml"))
    api = f"http://127.0.0.1:{api_port}"
    wait_until(lambda: http_ok(f"{api}/healthz"), 60, what="the control plane")
    processes.start("agent", "agent", "--config", str(tmp / "agent.yaml"))
    wait_until(lambda: http_ok(f"http://127.0.0.1:{agent_port}/healthz"), 60, what="the agent")
    return api, f"http://127.0.0.1:{agent_port}", ports


def _series(prom: str, expr: str) -> list[dict[str, Any]]:
    answer = query(prom, expr)
    assert answer.get("status") == "success", (expr, answer.get("error"))
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _has(prom: str, expr: str) -> bool:
    return bool(query(prom, expr).get("data", {}).get("result"))


def _replica_states(api: str) -> dict[str, str]:
    rows = probe.get(f"{api}/v1/replicas", headers={"Authorization": f"Bearer {VIEWER}"}, timeout=5).json()
    return {r["name"]: r["state"] for r in (rows if isinstance(rows, list) else rows.get("replicas", []))}


def empty_panels(prom: str, values: dict[str, str], boards: list[Path] = DASHBOARDS) -> list[str]:
    """Each panel query that returns no series (or fails), as "board / panel: expr"; the live check's core."""
    missing = []
    for board in boards:
        for title, expr in dashboard_exprs(board):
            ran = substitute(expr, values)
            answer = query(prom, ran)
            if answer.get("status") != "success" or not answer["data"]["result"]:
                missing.append(f"{board.stem} / {title}: {ran} ({answer.get('error', 'no series')})")
    return missing


def test_every_panel_of_every_dashboard_returns_data_on_a_live_fleet(tmp_path: Path, stack: StackProcesses) -> None:
    api, _agent, ports = _start_fleet(tmp_path, stack)
    prom = start_prometheus_for_fleet(tmp_path, stack, control_plane=api, token=VIEWER,
                                      rules=shortened_rules(tmp_path / "rules.yml"))
    wait_until(lambda: set(_replica_states(api).values()) == {"READY"} and len(_replica_states(api)) == 3, 90,
               what="three READY replicas in the control plane")

    with SteadyTraffic(ports[0], every=0.2, timeout=20), SteadyTraffic(ports[1], every=0.2, timeout=20), \
            SteadyTraffic(ports[2], every=0.3, timeout=20):
        # Discovery: one agent target and one engine target per replica, each with the fleet's labels.
        wait_until(lambda: len(_series(prom, 'up{job="pitstop-engines"} == 1')) == 3, 60, interval=0.5,
                   what="Prometheus scraping the three engines through the agent")
        engines = _series(prom, 'up{job="pitstop-engines"}')
        assert {(s["metric"]["node"], s["metric"]["replica"], s["metric"]["model"], s["metric"]["gpu"])
                for s in engines} == {(NODE, "r0", MODEL, "0"), (NODE, "r1", MODEL, "1"), (NODE, "hot", MODEL, "2")}
        # Scraped every second with a 1 s timeout: on a busy host one scrape can miss, so the test waits for a
        # successful one of each rather than reading whichever came last.
        wait_until(lambda: _has(prom, f'up{{job="pitstop-agent", node="{NODE}"}} == 1'), 60, interval=0.5,
                   what="Prometheus scraping the agent with the node's label")
        wait_until(lambda: _has(prom, 'up{job="pitstop-controlplane"} == 1'), 60, interval=0.5,
                   what="Prometheus scraping the control plane")
        # vLLM's own histograms arrive with the fleet's labels and vLLM's own.
        # (A missed scrape marks the target's series stale until the next one: its last sample is read instead.)
        r0_ttft = 'last_over_time(vllm:time_to_first_token_seconds_count{replica="r0"}[1m])'
        wait_until(lambda: _has(prom, r0_ttft), 60, interval=0.5, what="r0's TTFT histogram in Prometheus")
        ttft = _series(prom, r0_ttft)
        assert ttft and ttft[0]["metric"]["model_name"] and ttft[0]["metric"]["node"] == NODE

        # An operator's restart reaches its outcome: something for the actions panels and annotations.
        restart = probe.post(f"{api}/v1/replicas/{NODE}/r0/actions", json={"kind": "restart"},
                             headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=10)
        assert restart.status_code == 201, restart.text
        wait_until(lambda: _has(prom, 'pitstop_cp_actions_total{kind="restart", outcome="succeeded"} > 0'), 120,
                   interval=1, what="the restart counted as succeeded")

        wait_until(lambda: _has(prom, 'ALERTS{alertname="GPUHot", alertstate="firing"}'), 90, interval=1,
                   what="GPUHot firing for the hot GPU")
        wait_until(lambda: _has(prom, "pitstop_gpu_xid_errors_total"), 60, interval=1, what="the XID counted")
        wait_until(lambda: _has(prom, "model_engine:itl_seconds:p99_1m")
                   and _has(prom, "model_engine:e2e_seconds:p99_5m"),
                   60, interval=1, what="the latency recording rules evaluated")

        concrete = {"node": NODE, "model": MODEL, "replica": "r0", "gpu": "0", "engine": "vllm"}
        every = {name: ".*" for name in concrete}
        missing: list[str] = []

        def all_answer() -> bool:
            missing[:] = empty_panels(prom, concrete) + empty_panels(prom, every)
            return not missing

        # Rates over a window need two samples inside it, and rules evaluate every second: allow them time.
        with contextlib.suppress(AssertionError):  # the assertion below names what is still empty
            wait_until(all_answer, 60, interval=3, what="every panel answering")
        assert missing == []

        for board in DASHBOARDS:
            for var in dashboard_variable_exprs(board):
                selector = var.removeprefix("label_values(").rsplit(",", 1)[0]
                assert _has(prom, substitute(selector, every)), (board.name, var)

        # The same check catches a panel on a name nobody exports (a typo, a renamed vLLM series).
        bogus = tmp_path / "bogus.json"
        bogus.write_text(json.dumps({"panels": [
            {"title": "real", "targets": [{"expr": 'sum by (model) (vllm:num_requests_running{node=~"$node"})'}]},
            {"title": "typo", "targets": [{"expr": 'sum(rate(vllm:num_requests_runing{node=~"$node"}[1m]))'}]},
        ]}))
        assert [m.split(":")[0] for m in empty_panels(prom, every, [bogus])] == ["bogus / typo"]
