"""Real agent, simulated engines, real Prometheus evaluating the repo's rules, real Alertmanager, a webhook.

Faults: one engine wedges (``--fault-hang-after``: /health stays 200, no token moves) while requests wait on
it, another engine's GPU heats past its slowdown threshold (``--fault-hot-gpu-after``), and a third engine
fails every start until the agent gives up (``--fault-fail-start`` → FATAL). The rules are
loaded with every ``for:`` cut to 3 s (``shortened_rules``); the product durations are covered by promtool.
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
from tests.observability.rules import (
    DASHBOARDS,
    RUNBOOK_BASE,
    concrete,
    dashboard_exprs,
    dashboard_variable_exprs,
    load_rules,
    pitstop_series,
    recorded_names,
    runbook_file,
)
from tests.observability.stack import (
    ALERTMANAGER,
    PROMETHEUS,
    WebhookReceiver,
    firing,
    query,
    shortened_rules,
    start_alertmanager,
    start_prometheus,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None,
                       reason="needs Debian's prometheus and prometheus-alertmanager"),
]


def _start_agent(tmp: Path, processes: StackProcesses) -> tuple[str, int]:
    port, hung_port, hot_port = free_port(), free_port(), free_port()
    sim = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp / "simgpu")]
    config = tmp / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "obs-node", "port": port, "control_plane": None,
        # Canaries every 5 s, the default rate (every scrape interval of 5 s): at every 0.5 s scrape they would
        # be ten times the traffic, and the early RSS growth it brings reads as a leak under 3 s rules.
        "scrape_interval": 0.5, "canary_every": 10, "gpu_backend": "sim", "sim_gpu_count": 3,
        "sim_gpu_dir": str(tmp / "simgpu"),
        "state_dir": str(tmp / "agent-state"),
        "backoff": {"base": 0.5, "cap": 1.0, "max_failures": 3, "window": 600},
        "replicas": [
            {"name": "hot", "model": "tiny", "port": hot_port, "gpus": [0],
             "args": [*sim, "--fault-hot-gpu-after", "3"], "stop_timeout": 5, "drain_timeout": 2},
            # Warmup must finish before the engine wedges, or the replica never reaches READY.
            {"name": "wedged", "model": "tiny", "port": hung_port, "gpus": [1],
             "args": [*sim, "--fault-hang-after", "8"], "stop_timeout": 5, "drain_timeout": 2},
            # Exits during every start: BACKOFF three times, then FATAL.
            {"name": "broken", "model": "tiny", "port": free_port(), "gpus": [2],
             "args": [*sim, "--fault-fail-start"], "stop_timeout": 5},
        ],
    }))
    processes.start("agent", "agent", "--config", str(config))
    agent = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{agent}/healthz"), 60, what="the agent")
    return agent, hung_port


def _ready(agent: str, name: str) -> bool:
    try:
        return probe.get(f"{agent}/v1/replicas/{name}/ready", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def _received(receiver: WebhookReceiver, alertname: str, **labels: str) -> dict[str, Any] | None:
    for alert in receiver.alerts():
        got = alert["labels"]
        if got.get("alertname") == alertname and all(got.get(k) == v for k, v in labels.items()):
            return alert
    return None


def test_faults_fire_alerts_that_reach_the_webhook_with_runbooks(tmp_path: Path, stack: StackProcesses) -> None:
    agent, hung_port = _start_agent(tmp_path, stack)
    with WebhookReceiver() as receiver:
        am = start_alertmanager(tmp_path, stack, receiver.url)
        prom = start_prometheus(tmp_path, stack, agent=agent, alertmanager=am,
                                rules=shortened_rules(tmp_path / "rules.yml"))
        wait_until(lambda: _ready(agent, "wedged") and _ready(agent, "hot"), 60, what="both replicas READY")
        wait_until(lambda: query(prom, 'up{job="pitstop-agent"} == 1')["data"]["result"] != [], 30,
                   what="Prometheus scraping the agent")

        # The engine wedges 8 s after it started; from then on the requests queue and no token moves.
        with SteadyTraffic(hung_port, every=1.0, timeout=20):
            _alerts_arrive(receiver, prom)
        _dashboards_and_rules_query_cleanly(prom)
        _live_agent_declares_every_agent_series_used(agent)


def _live_agent_declares_every_agent_series_used(agent: str) -> None:
    """Every agent series a rule or panel names is declared (# TYPE) on a real agent's /metrics."""
    text = probe.get(f"{agent}/metrics", timeout=5).text
    declared = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            # The text format names a counter family with or without _total, by client version.
            declared |= {name, name.removesuffix("_total") + "_total"} if kind == "counter" else {name}
    data = load_rules()
    used = set().union(*(pitstop_series(r["expr"]) for g in data["groups"] for r in g["rules"]))
    for board in DASHBOARDS:
        used |= set().union(*(pitstop_series(expr) for _, expr in dashboard_exprs(board)))
    agent_used = {n for n in used if n.startswith("pitstop_") and not n.startswith("pitstop_cp_")}
    assert agent_used - declared == set()


def _alerts_arrive(receiver: WebhookReceiver, prom: str) -> None:
    """The faults' alerts reach the webhook with their evidence and runbooks; the healthy parts raise none."""

    def delivered(name: str, **labels: str) -> bool:
        return _received(receiver, name, **labels) is not None

    wait_until(lambda: delivered("EngineStalled", replica="wedged"), 90, interval=0.5,
               what="EngineStalled for the wedged engine at the webhook")
    wait_until(lambda: delivered("GPUThrottled", gpu="0"), 60, interval=0.5,
               what="GPUThrottled for the hot GPU at the webhook")
    wait_until(lambda: delivered("ReplicaCrashLoop", replica="broken"), 60, interval=0.5,
               what="ReplicaCrashLoop for the replica that cannot start at the webhook")

    fatal = _received(receiver, "ReplicaCrashLoop", replica="broken")
    assert fatal is not None and fatal["labels"]["severity"] == "page"
    assert "gave up restarting replica broken of tiny on obs-node after" in fatal["annotations"]["description"]

    stalled = _received(receiver, "EngineStalled", replica="wedged")
    assert stalled is not None
    assert stalled["labels"]["severity"] == "warning"
    assert stalled["labels"]["node"] == "obs-node"
    runbook = stalled["annotations"]["runbook_url"]
    assert runbook == f"{RUNBOOK_BASE}runbooks/alerts/EngineStalled.md" and runbook_file(runbook).is_file()
    description = stalled["annotations"]["description"]
    assert "Replica wedged of tiny on obs-node has generated no token for 2 minutes" in description
    hot = _received(receiver, "GPUHot", gpu="0")
    assert hot is not None and runbook_file(hot["annotations"]["runbook_url"]).is_file()

    # The healthy engine's replica and the cool GPU raise nothing; the agent is up.
    names = {(a["labels"]["alertname"], a["labels"].get("replica"), a["labels"].get("gpu"))
             for a in firing(prom)}
    # Trend alerts are left out: their product rules need 30 minutes of a 1 h slope, and under 3 s rules any
    # engine's first minute of allocations (canary traffic included) reads as a leak.
    trends = {"HostRSSLeak", "ReplicaGPUMemoryGrowing"}
    assert not any(replica == "hot" for name, replica, _ in names if name not in trends), names
    assert not any(gpu in ("1", "2") and name.startswith("GPU") for name, _, gpu in names), names
    assert not any(name in ("AgentDown", "ReplicaDown") for name, _, _ in names), names
    assert {replica for name, replica, _ in names if name == "ReplicaCrashLoop"} == {"broken"}


def _dashboards_and_rules_query_cleanly(prom: str) -> None:
    """Every panel's and variable's PromQL runs on the live Prometheus; agent series they name exist there."""
    errors = []
    for board in DASHBOARDS:
        for title, expr in dashboard_exprs(board):
            answer = query(prom, concrete(expr))
            if answer.get("status") != "success":
                errors.append(f"{board.name} / {title}: {answer.get('error')}")
        for var in dashboard_variable_exprs(board):
            # label_values(SELECTOR, label): the selector must find series on a live agent.
            selector = var.removeprefix("label_values(").rsplit(",", 1)[0]
            answer = query(prom, concrete(selector))
            if answer.get("status") != "success" or not answer["data"]["result"]:
                errors.append(f"{board.name} variable {var!r}: no data")
    assert errors == []
    # Recording rules evaluate to data on a live fleet (names and label sets fit the exporter).
    for name in ("model:pitstop_replicas_ready:ratio", "node_gpu:pitstop_gpu_thermal_headroom_celsius"):
        assert name in recorded_names(load_rules())
        assert query(prom, name)["data"]["result"], name
