"""Dark node: from a node going dark to on-call's page, and from its return to the resolve, at the defaults.

A real ``pitstop server`` with its shipped policies and settings (``node-unreachable``: no report for 60 s, a
page) pages a PagerDuty Events v2 endpoint on loopback; a real ``pitstop agent`` at its defaults (a report every
5 s) supervises two simulated replicas of two models and reports through a TCP proxy that can black-hole the
link (``bench/harness/tcp_proxy.py``). Each fault, ``--runs`` times, on a fresh fleet:

- ``kill``: the agent is killed with SIGKILL (a host gone dark, as far as the control plane can tell); once the
  page came, a new agent starts and adopts the engines.
- ``partition``: the proxy black-holes the link (connections accepted, no byte passed on) until the page came,
  then heals.

Reported per run: the fault to the node's page (and to each model's: both models had their only replica there),
the return (heal, or the new agent's start) to the resolve, and whether the engines served throughout.

    python bench/dark_node.py [--runs 3] [--out bench/results/dark_node.json]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.figures import fmt, host_note, median, table, write_json
from bench.harness.fleet import Replica, server_config
from bench.harness.http import http_ok, probe
from bench.harness.pager import PagerDutyReceiver, PagerEvent
from bench.harness.procs import Processes, free_port, wait_until
from bench.harness.tcp_proxy import BlackHoleProxy
from controlplane.policy.durations import parse_duration
from controlplane.policy_files import DEFAULTS_DIR

NODE = "dark-bench"
ROUTING_KEY = "benchROUTINGkey0123456789abcdef0"
FAULTS = ("kill", "partition")
PAGE = "pitstop-node-unreachable"


def policy_for() -> float:
    return parse_duration(yaml.safe_load((DEFAULTS_DIR / "node-unreachable.yaml").read_text())["condition"]["for"])


def one_run(tmp: Path, fault: str) -> dict[str, Any]:
    replicas = [Replica("chat-0", args=["--sim-startup-seconds", "1"], gpu=0, model="chat"),
                Replica("code-0", args=["--sim-startup-seconds", "1"], gpu=1, model="code")]
    with Processes(tmp / "logs") as procs, PagerDutyReceiver() as pager:
        cp_port, agent_port = free_port(), free_port()
        (tmp / "server.yaml").write_text(yaml.safe_dump(server_config({
            "port": cp_port, "database_url": f"sqlite:///{tmp / 'cp.db'}", "external_url": "https://pitstop.bench.invalid",
            "notifier": {"receivers": [{"name": "pager", "pagerduty": {"url": pager.url,
                                                                       "routing_key": ROUTING_KEY}}],
                         "route": {"receiver": "pager"}}})))
        server = procs.start("server", "server", "--config", str(tmp / "server.yaml"), "--log-level", "warning")
        cp = f"http://127.0.0.1:{cp_port}"
        procs.wait_serving(server, f"{cp}/healthz", 60)
        with BlackHoleProxy(cp_port) as proxy:
            sim_gpu_dir = tmp / "simgpu"
            (tmp / "agent.yaml").write_text(yaml.safe_dump({
                "node": NODE, "port": agent_port, "control_plane": proxy.url, "gpu_backend": "sim",
                "sim_gpu_count": 2, "sim_gpu_dir": str(sim_gpu_dir), "state_dir": str(tmp / "agent-state"),
                "replicas": [r.agent_entry(sim_gpu_dir) for r in replicas]}))
            agent = procs.start("agent", "agent", "--config", str(tmp / "agent.yaml"))
            agent_url = f"http://127.0.0.1:{agent_port}"
            procs.wait_serving(agent, f"{agent_url}/healthz", 60)
            wait_until(lambda: all(http_ok(f"{agent_url}/v1/replicas/{r.name}/ready") for r in replicas), 90,
                       what="both replicas READY")
            wait_until(lambda: http_ok(f"{cp}/v1/nodes/{NODE}"), 60, what="the node reported")
            engines = _engine_pids(agent_url)
            time.sleep(6)  # past one report interval: the node is current when the fault comes
            fault_at = time.time()
            if fault == "kill":
                assert agent.pid is not None
                os.kill(agent.pid, signal.SIGKILL)
            else:
                proxy.cut()
            wait_until(lambda: _first(pager, "trigger", f"node:{NODE}") is not None, 300, interval=0.2,
                       what=f"the node's page\n{procs.log('server')[-2000:]}")
            wait_until(lambda: all(_first(pager, "trigger", f"model:{m}") for m in ("chat", "code")), 30,
                       interval=0.2, what="each model's page")
            served = all(http_ok(f"http://127.0.0.1:{r.port}/health") for r in replicas)
            back_at = time.time()
            if fault == "kill":
                again = procs.start("agent-2", "agent", "--config", str(tmp / "agent.yaml"))
                procs.wait_serving(again, f"{agent_url}/healthz", 60)
            else:
                proxy.heal()
            page = _first(pager, "trigger", f"node:{NODE}")
            assert page is not None

            def resolved() -> PagerEvent | None:  # a resolve names its incident by the trigger's dedup key
                return next((e for e in list(pager.events) if e.action == "resolve" and e.dedup_key == page.dedup_key),
                            None)

            wait_until(lambda: resolved() is not None, 120, interval=0.2,
                       what=f"the node's resolve\n{procs.log('server')[-2000:]}")
            resolve = resolved()
            assert resolve is not None
            adopted = sorted(_engine_pids(agent_url)) == sorted(engines)
            models = {m: None if (e := _first(pager, "trigger", f"model:{m}")) is None else round(e.at - fault_at, 2)
                      for m in ("chat", "code")}
            return {"fault": fault, "page_s": round(page.at - fault_at, 2), "model_pages_s": models,
                    "resolve_s": round(resolve.at - back_at, 2), "engines_served": served,
                    "engines_adopted": adopted, "pages": pager.alertnames()}


def _first(pager: PagerDutyReceiver, action: str, target: str) -> PagerEvent | None:
    """The first event of ``action`` (trigger, resolve) carrying the node-unreachable alert on ``target``."""
    for event in list(pager.events):
        if event.action == action and any((a.get("labels") or {}).get("target") == target
                                          and (a.get("labels") or {}).get("alertname") == PAGE
                                          for a in event.alerts()):
            return event
    return None


def _engine_pids(agent_url: str) -> list[int]:
    return [r["process"]["pid"] for r in probe.get(f"{agent_url}/v1/replicas", timeout=5).json() if r.get("process")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dark_node.json")
    args = p.parse_args()
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for fault in FAULTS:
            with tempfile.TemporaryDirectory(prefix="bench-dark-") as tmp:
                r = one_run(Path(tmp), fault)
            runs.append(r)
            print(f"run {i + 1} {fault}: page {r['page_s']} s, model pages {r['model_pages_s']}, resolve "
                  f"{r['resolve_s']} s after the return, engines served {r['engines_served']}, adopted "
                  f"{r['engines_adopted']}", flush=True)
    held = policy_for()
    medians: dict[str, Any] = {}
    rows = []
    for fault in FAULTS:
        mine = [r for r in runs if r["fault"] == fault]
        medians[fault] = m = {"page_s": median([r["page_s"] for r in mine]),
                              "resolve_s": median([r["resolve_s"] for r in mine]),
                              "engines_served": all(r["engines_served"] for r in mine)}
        rows.append([fault, fmt(m["page_s"], " s"), fmt(m["page_s"] - held, " s"), fmt(m["resolve_s"], " s"),
                     "yes" if m["engines_served"] else "NO"])
    print(f"\ndark node at the defaults (node-unreachable for: {held:g} s, agent report every 5 s), medians of "
          f"{args.runs} run(s); {host_note()}")
    print(table(["fault", "fault -> page", "past the for:", "return -> resolve", "engines served"], rows))
    write_json(args.out, "dark_node", {"settings": {"runs": args.runs, "for_s": held}, "medians": medians,
                                       "runs": runs})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
