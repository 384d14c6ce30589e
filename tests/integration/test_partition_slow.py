"""A five-minute partition loses no reading, and pages while it lasts.

A real ``pitstop server`` (its shipped ``node-unreachable`` policy at its defaults: a page after 60 s of silence)
and a real ``pitstop agent`` reporting every second, through a TCP proxy that black-holes the link for five
minutes (connections accepted, no byte passed on). The engines serve throughout; on-call gets the node's page
during the partition and its resolve after; and once the link is back, every reading the agent kept reaches the
store, in time order, once: the node's history has no hole.
"""

from __future__ import annotations

import itertools
import re
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from bench.harness.http import probe
from bench.harness.procs import Processes
from bench.harness.tcp_proxy import BlackHoleProxy
from tests.helpers import free_port, http_ok, wait_until
from tests.notify.receiving import Receiving, said

# early: five minutes of waiting, started first so the rest of the suite runs beside it.
pytestmark = [pytest.mark.slow, pytest.mark.early, pytest.mark.timeout(600)]

NODE = "split-node"
PARTITION_SECONDS = 300


def _metric(agent: str, name: str) -> float:
    for line in probe.get(f"{agent}/metrics", timeout=5).text.splitlines():
        if line.startswith(f"{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def _times(cp: str) -> list[datetime]:
    samples = probe.get(f"{cp}/v1/replicas/{NODE}/chat-0/samples", params={"limit": 10_000}, timeout=10).json()
    return [datetime.fromisoformat(s["at"]) for s in samples]


def test_a_five_minute_partition_pages_and_loses_no_reading(tmp_path: Path) -> None:
    pager = Receiving(default=202)
    with Processes(tmp_path / "logs") as processes:
        port = free_port()
        (tmp_path / "pd-key").write_text("R0UTINGKEYsplit123456789abcdef01\n")
        (tmp_path / "server.yaml").write_text(yaml.safe_dump({
            "port": port, "database_url": f"sqlite:///{tmp_path / 'cp.db'}", "notify_interval_seconds": 1,
            "external_url": "https://pitstop.example.internal",
            "notifier": {"receivers": [{"name": "pager", "pagerduty": {
                "url": pager.url, "routing_key_file": str(tmp_path / "pd-key")}}],
                "route": {"receiver": "pager", "group_by": ["model", "node"], "group_wait": "0s",
                          "group_interval": "1s", "repeat_interval": "4h"}}}))
        server = processes.start("server", "server", "--config", str(tmp_path / "server.yaml"))
        cp = f"http://127.0.0.1:{port}"
        processes.wait_serving(server, f"{cp}/healthz", 60)
        with BlackHoleProxy(port) as proxy:
            agent_port, engine_port = free_port(), free_port()
            sim = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp_path / "simgpu")]
            (tmp_path / "agent.yaml").write_text(yaml.safe_dump({
                "node": NODE, "port": agent_port, "control_plane": proxy.url, "report_interval": 1,
                "scrape_interval": 1, "gpu_backend": "sim", "sim_gpu_count": 1, "sim_gpu_dir": str(tmp_path / "simgpu"),
                "state_dir": str(tmp_path / "agent-state"),
                "replicas": [{"name": "chat-0", "model": "chat", "port": engine_port, "gpus": [0], "args": sim}]}))
            agent = f"http://127.0.0.1:{agent_port}"
            processes.wait_serving(processes.start("agent", "agent", "--config", str(tmp_path / "agent.yaml")),
                                   f"{agent}/healthz", 60)
            wait_until(lambda: http_ok(f"{agent}/v1/replicas/chat-0/ready", timeout=3), 60, what="chat-0 READY")
            wait_until(lambda: len(_times(cp)) >= 5, 60, what="readings stored before the cut")

            proxy.cut()
            cut = time.monotonic()
            served: list[bool] = []
            while time.monotonic() - cut < PARTITION_SECONDS:
                served.append(http_ok(f"http://127.0.0.1:{engine_port}/health", timeout=3))
                time.sleep(5)
            paged = [b for b in list(pager.bodies) if said("pager", b) == "firing"]
            kept = _metric(agent, "pitstop_agent_backlog_kept_total")
            proxy.heal()

            wait_until(lambda: _metric(agent, "pitstop_agent_backlog_readings") == 0
                       and _metric(agent, "pitstop_agent_backlog_kept_total") >= kept, 60,
                       what=f"the kept readings sent\n{processes.log('agent')[-3000:]}")
            wait_until(lambda: any(said("pager", b) == "resolved" for b in list(pager.bodies)), 60,
                       what=f"the page resolved\n{processes.log('server')[-3000:]}")
            kept = _metric(agent, "pitstop_agent_backlog_kept_total")
            sent = _metric(agent, "pitstop_agent_backlog_sent_total")
            dropped = _metric(agent, "pitstop_agent_backlog_dropped_total")
            refused = _metric(agent, "pitstop_agent_backlog_refused_total")
            log = processes.log("agent")
            times = _times(cp)
    pager.close()

    assert all(served), "an engine stopped serving during the partition"
    assert any(f"node {NODE} unreachable" in b["payload"]["summary"] for b in paged), paged
    assert len(times) == len(set(times)), "a reading was stored twice"
    assert times == sorted(times)
    # Five minutes at one reading a second, every one kept and every one stored: the history has no hole.
    assert kept >= PARTITION_SECONDS * 0.8 and (dropped, refused) == (0, 0), (kept, dropped, refused)
    assert sent == kept  # every kept reading got the control plane's answer
    # Its account of each batch sent after the outage, as the agent logged it: every reading stored (or held
    # already, its report's answer lost at the cut).
    answered = [(int(a), int(b), int(c)) for a, b, c in re.findall(
        r"sent (\d+) reading\(s\) kept while the control plane was away: (\d+) stored, (\d+) held already", log)]
    assert sum(count for count, _, _ in answered) >= PARTITION_SECONDS * 0.8, answered
    assert all(stored + held == count for count, stored, held in answered), answered
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    print(f"{kept:.0f} readings kept over {PARTITION_SECONDS} s, {len(times)} stored in all; the longest gap "
          f"{max(gaps):.1f} s")
    assert max(gaps) < 5, max(gaps)
