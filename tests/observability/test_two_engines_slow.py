"""A fleet of two engines through the whole loop: a real control plane, a real agent, simulated vLLM and SGLang
engines (each speaking its own API and /metrics), and a real Prometheus with the shipped rules.

- readings: both engines' replicas report, each under its own engine;
- a wedge of an SGLang engine (its steps frozen, its health handler still answering): restarted by the stall
  policy and READY again;
- a latency surge on an SGLang model: the governor lowers ``--max-running-requests`` (SGLang's flag, never
  vLLM's) on one canary replica, which restarts with it;
- Prometheus: the neutral recording rules and a dashboard panel hold both engines' models, and the ITL SLO alert
  fires for the SGLang model with its ``engine`` label.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.harness.http import probe
from tests.helpers import SteadyTraffic, free_port, http_ok, wait_until
from tests.observability.conftest import StackProcesses
from tests.observability.rules import DASHBOARDS, dashboard_exprs, substitute
from tests.observability.stack import PROMETHEUS, query, shortened_rules, start_prometheus_for_fleet

pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus")]

AGENT_TOKEN, VIEWER, OPERATOR = "agent-secret-token-0", "viewer-secret-token-0", "operator-secret-token-0"
NODE = "mixed"
READ = {"Authorization": f"Bearer {VIEWER}"}
POLICIES = [
    {"name": "stall", "condition": {"detector": "stall", "for": "3s"}, "action": {"kind": "restart"},
     "guardrails": {"cooldown": "10m"}},
    # The shipped itl-slo's shape, at a test's pace: only the surging SGLang model breaches.
    {"name": "itl-fast", "condition": {"signal": "itl_p99_seconds", "op": ">", "threshold": 0.2, "for": "5s",
                                       "min_share": 0.5},
     "action": {"kind": "lower_max_num_seqs", "ladder": [64, 32, 16], "min": 16, "step": "ladder", "canary": True},
     "guardrails": {"cooldown": "10m"}},
]


def _start(tmp: Path, stack: StackProcesses) -> tuple[str, dict[str, int]]:
    policies = tmp / "policies"
    policies.mkdir()
    for policy in POLICIES:
        (policies / f"{policy['name']}.yaml").write_text(yaml.safe_dump(policy))
    api_port, agent_port = free_port(), free_port()
    ports = {name: free_port() for name in ("v0", "s0", "s1", "sw")}
    (tmp / "server.yaml").write_text(yaml.safe_dump({
        "port": api_port, "database_url": f"sqlite:///{tmp / 'fleet.db'}", "agent_tokens": [AGENT_TOKEN],
        "viewer_tokens": [VIEWER], "operator_tokens": [OPERATOR], "policy_defaults": False,
        "policy_dirs": [str(policies)], "policy_interval_seconds": 1, "executor_interval_seconds": 0.5,
        "action_deadline_seconds": 90}))
    sim = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp / "simgpu")]
    surge = ["--max-running-requests", "64", "--fault-latency-surge-after", "8",
             "--fault-latency-surge-ms-per-seq", "400"]
    replicas: list[dict[str, Any]] = [
        {"name": "v0", "model": "tiny", "engine": "sim", "args": [*sim, "--max-num-seqs", "64"]},
        {"name": "s0", "model": "qwen", "engine": "sglang", "simulated": True, "args": [*sim, *surge]},
        {"name": "s1", "model": "qwen", "engine": "sglang", "simulated": True, "args": [*sim, *surge]},
        {"name": "sw", "model": "qwen-w", "engine": "sglang", "simulated": True,
         "args": [*sim, "--fault-hang-after", "12"]},
    ]
    for i, replica in enumerate(replicas):
        replica.update(port=ports[replica["name"]], gpus=[i], stop_timeout=5, drain_grace=0.5, drain_timeout=2)
    (tmp / "agent.yaml").write_text(yaml.safe_dump({
        "node": NODE, "port": agent_port, "control_plane": f"http://127.0.0.1:{api_port}", "token": AGENT_TOKEN,
        "report_interval": 0.5, "scrape_interval": 0.5, "canary_every": 2, "canary_timeout": 2,
        "gpu_backend": "sim", "sim_gpu_count": 4, "sim_gpu_dir": str(tmp / "simgpu"),
        "state_dir": str(tmp / "agent-state"), "backoff": {"base": 0.5, "cap": 2.0}, "replicas": replicas,
    }))
    stack.start("server", "server", "--config", str(tmp / "server.yaml"))
    api = f"http://127.0.0.1:{api_port}"
    wait_until(lambda: http_ok(f"{api}/healthz"), 60, what="the control plane")
    stack.start("agent", "agent", "--config", str(tmp / "agent.yaml"))
    wait_until(lambda: http_ok(f"http://127.0.0.1:{agent_port}/healthz"), 60, what="the agent")
    return api, ports


def _replicas(api: str) -> dict[str, dict[str, Any]]:
    try:
        rows = probe.get(f"{api}/v1/replicas", headers=READ, timeout=5).json()
    except httpx.HTTPError:
        return {}
    return {r["name"]: r for r in rows}


def _actions(api: str, policy: str) -> list[dict[str, Any]]:
    try:
        rows: list[dict[str, Any]] = probe.get(f"{api}/v1/actions", params={"policy": policy}, headers=READ,
                                               timeout=5).json()
    except httpx.HTTPError:
        return []
    return rows


def _series(prom: str, expr: str) -> list[dict[str, Any]]:
    answer = query(prom, expr)
    assert answer.get("status") == "success", (expr, answer.get("error"))
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _models_of(prom: str, expr: str) -> set[tuple[str, str]]:
    return {(s["metric"].get("model", ""), s["metric"].get("engine", "")) for s in _series(prom, expr)}


def test_a_vllm_and_an_sglang_fleet_go_through_the_whole_loop(tmp_path: Path, stack: StackProcesses) -> None:
    api, ports = _start(tmp_path, stack)
    prom = start_prometheus_for_fleet(tmp_path, stack, control_plane=api, token=VIEWER,
                                      rules=shortened_rules(tmp_path / "rules.yml"))
    wait_until(lambda: len(_replicas(api)) == 4 and all(r["state"] == "READY" for r in _replicas(api).values()),
               90, what="four READY replicas in the control plane")
    with SteadyTraffic(ports["v0"], every=0.3, timeout=20), SteadyTraffic(ports["s0"], every=0.3, timeout=20), \
            SteadyTraffic(ports["s1"], every=0.3, timeout=20), SteadyTraffic(ports["sw"], every=0.5, timeout=15):
        # Readings: each replica under its own engine, its engine's figures read through its adapter.
        wait_until(lambda: all((r.get("engine") or {}).get("ttft_p99_seconds") is not None
                               for n, r in _replicas(api).items() if n != "sw"), 60,
                   what="latency readings from both engines")
        rows = _replicas(api)
        assert {n: r["engine_kind"] for n, r in rows.items()} == {"v0": "vllm", "s0": "sglang", "s1": "sglang",
                                                                  "sw": "sglang"}
        assert rows["s0"]["engine"]["generation_tokens_per_second"] is not None

        # The SGLang wedge: restarted by the stall policy, READY again at a new generation.
        wait_until(lambda: any(a["kind"] == "restart" and a["state"] == "succeeded"
                               for a in _actions(api, "stall")), 120, what="the wedged SGLang engine restarted")
        restarts = [a for a in _actions(api, "stall") if a["kind"] == "restart"]
        assert {a["target"] for a in restarts} == {f"replica:{NODE}/sw"}
        assert all(a["evidence"][0]["detector"] == "stall" for a in restarts)

        # The surge: the governor lowers SGLang's own flag on one canary replica, which restarts with it.
        wait_until(lambda: any(a["kind"] == "lower_max_num_seqs" for a in _actions(api, "itl-fast")), 120,
                   what="the governor acting on the SGLang model")
        [lower] = [a for a in _actions(api, "itl-fast") if a["kind"] == "lower_max_num_seqs"]
        assert lower["params"]["flag"] == "--max-running-requests" and lower["params"]["max_num_seqs"] == 32
        [(canary, args)] = lower["params"]["engine_args"].items()
        assert args[args.index("--max-running-requests") + 1] == "32" and "--max-num-seqs" not in args
        name = canary.split("/")[1]

        def canary_runs_it() -> bool:
            row = _replicas(api).get(name, {})
            return row.get("state") == "READY" and "32" in row.get("engine_args", [])[-1:]

        wait_until(canary_runs_it, 120, what="the canary READY with --max-running-requests 32")
        assert "--max-num-seqs" not in _replicas(api)[name]["engine_args"]

        # Prometheus: both engines' models in the neutral rules and on a dashboard panel, and the SGLang model's
        # ITL SLO alert firing with its engine.
        both = {("tiny", "vllm"), ("qwen", "sglang")}
        wait_until(lambda: both <= _models_of(prom, "model_engine:itl_seconds:p99_1m"), 90, interval=1,
                   what="both engines' ITL in the recording rules")
        fleet = next(b for b in DASHBOARDS if b.stem == "pitstop-fleet")
        [(title, expr)] = [(t, e) for t, e in dashboard_exprs(fleet) if "itl_seconds:p99_1m" in e][:1]
        shown = substitute(expr, {"node": ".*", "model": ".*", "replica": ".*", "gpu": ".*", "engine": ".*"})
        assert {"tiny", "qwen"} <= {m for m, _ in _models_of(prom, shown)}, (title, shown)
        wait_until(lambda: _series(prom, 'ALERTS{alertname="ITLSLOBreach", alertstate="firing", model="qwen"}'),
                   90, interval=1, what="ITLSLOBreach firing for the SGLang model")
        [alert] = _series(prom, 'ALERTS{alertname="ITLSLOBreach", alertstate="firing", model="qwen"}')
        assert alert["metric"]["engine"] == "sglang"
