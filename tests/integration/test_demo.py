"""`pitstop demo` (what `make demo` runs): the whole path up, Pitstop handling the fault timeline, all of it
down again, and the timeline of what happened."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.harness.http import probe
from tests.helpers import http_ok, wait_until

# Every demo takes the first free port from 8000 up: two at once would race for them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]

# The fault timeline at half speed: its faults within 50 s of the fleet being up, Pitstop's last act (the
# canary's rollout to every replica) within about two minutes.
SCALE = 0.5
EXPECTED = {"wedge": ("stall", "restart"), "leak": ("rss-leak", "planned_restart"),
            "hot_gpu": ("thermal", "alert"), "latency_surge": ("itl-slo", "lower_max_num_seqs")}


def _leftovers(state: str) -> list[psutil.Process]:
    """Processes the demo started (it marks their environment) that are still alive."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PITSTOP_DEMO_STATE") == state:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@contextmanager
def demo(tmp_path: Path, *args: str) -> Iterator[dict[str, Any]]:
    """The demo running with ``args`` until its URLs are written; stopped (SIGINT) and checked for leftovers."""
    state = tmp_path / "state"
    with (tmp_path / "demo.out").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "demo", "--state-dir", str(state), *args],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: (state / "demo.json").exists() or proc.poll() is not None, 180, what="demo.json")
            assert proc.poll() is None, (tmp_path / "demo.out").read_text()
            yield json.loads((state / "demo.json").read_text())
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
    time.sleep(1)
    assert _leftovers(str(state)) == [], "the demo left processes running"
    assert "every process stopped" in (tmp_path / "demo.out").read_text()


def _api(urls: dict[str, Any], path: str) -> Any:
    return probe.get(f"{urls['api']}{path}", headers={"Authorization": f"Bearer {urls['operator_token']}"},
                     timeout=5).json()


def _timeline(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "state" / "timeline.json").read_text()))


def test_calm_demo_serves_four_ready_replicas_under_load_and_acts_on_nothing(tmp_path: Path) -> None:
    with demo(tmp_path, "--calm", "--no-prometheus") as urls:
        for key in ("console", "api", "agent_metrics", "agent_token"):
            assert urls[key], key
        assert http_ok(f"{urls['console']}/_stcore/health")
        replicas = _api(urls, "/v1/replicas")
        assert len(replicas) == 4
        assert all(r["state"] == "READY" for r in replicas), replicas

        def tokens() -> float:
            text = probe.get(urls["agent_metrics"], timeout=3).text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("pitstop_engine_generation_tokens_per_second{"))

        # The load keeps the engines busy, so the agent sees tokens flowing.
        wait_until(lambda: tokens() > 0, 30, interval=1, what="generation tokens from the demo's load")
        time.sleep(20)
    timeline = _timeline(tmp_path)
    assert timeline["faults"] == []
    assert timeline["other_actions"] == []
    assert timeline["load"]["requests_ok"] > 0
    assert timeline["load"]["requests_failed"] == 0


def test_fault_timeline_is_detected_and_acted_on_without_failing_a_request(tmp_path: Path) -> None:
    with demo(tmp_path, "--timeline-scale", f"{SCALE:g}", "--no-console", "--no-prometheus") as urls:
        def handled() -> bool:
            done = {(a["policy"], a["kind"]) for a in _api(urls, "/v1/actions?limit=500")
                    if a["state"] == "succeeded"}
            return all(expected in done for expected in EXPECTED.values())

        wait_until(handled, 300, interval=2, what="every fault handled")
        # The surge made the agent cut canaries at their deadline, which vLLM counts as aborted requests: they
        # are the agent's own, so no replica shows a user's error while no client request failed (the error-rate
        # policy, the console and the exported ratio all read errors_per_second).
        metrics = probe.get(urls["agent_metrics"], timeout=5).text
        cut = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("pitstop_canary_aborts_total{"))
        errors = {f"{r['node']}/{r['name']}": [s["values"].get("errors_per_second") for s in _api(
            urls, f"/v1/replicas/{r['node']}/{r['name']}/samples?limit=10000")] for r in _api(urls, "/v1/replicas")}
    assert cut > 0, metrics
    assert all(not any(e or 0 for e in series) for series in errors.values()), errors
    out = (tmp_path / "demo.out").read_text()
    assert "Demo overlay" in out and "Timeline" in out, out
    timeline = _timeline(tmp_path)
    rows = {row["fault"]: row for row in timeline["faults"]}
    assert set(rows) == set(EXPECTED)
    for fault, (policy, kind) in EXPECTED.items():
        row = rows[fault]
        assert row["fault_at"] <= row["detected_at"] <= row["acted_at"], row
        action = row["action"]
        assert (action["policy"], action["kind"], action["state"]) == (policy, kind, "succeeded"), row
    # The wedged replica's restart is its own (stall), not a side effect of the surge's rollout.
    assert rows["wedge"]["action"]["target"].endswith("/replica-0")
    load = timeline["load"]
    assert load["requests_ok"] > 0
    assert load["requests_failed"] == 0, load
    # What the wedged replica held was cut and completed elsewhere: counted, not hidden.
    assert sum(load["attempts_failed"].values()) >= load["requests_retried"]
    assert f"Load: {load['requests_ok']} requests ok, 0 failed" in out


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus")
def test_demo_starts_prometheus_scraping_the_agent_and_every_engine(tmp_path: Path) -> None:
    with demo(tmp_path, "--calm", "--no-console") as urls:
        assert urls["prometheus"], urls
        if shutil.which("prometheus-alertmanager") or shutil.which("alertmanager"):
            assert http_ok(f"{urls['alertmanager']}/-/ready")

        def up() -> dict[str, int]:
            targets = probe.get(f"{urls['prometheus']}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            counts: dict[str, int] = {}
            for t in targets:
                if t["health"] == "up":
                    counts[t["labels"]["job"]] = counts.get(t["labels"]["job"], 0) + 1
            return counts

        wait_until(lambda: up().get("pitstop-agent") == 1 and up().get("pitstop-engines") == 4, 90, interval=2,
                   what="the agent and four engines up in Prometheus")
        out = (tmp_path / "demo.out").read_text()
        assert f"Prometheus       {urls['prometheus']}" in out


def test_a_calm_demo_with_its_engines_in_containers_serves_and_leaves_nothing(tmp_path: Path) -> None:
    """``--containers``: the engines run in a Podman of the demo's own, and the demo's stop takes them all."""
    with demo(tmp_path, "--containers", "--calm", "--no-console", "--no-prometheus", "--replicas", "2") as urls:
        replicas = _api(urls, "/v1/replicas")
        assert len(replicas) == 2 and all(r["state"] == "READY" for r in replicas), replicas

        def engines() -> list[dict[str, Any]]:
            return list(probe.get(f"{urls['agent']}/v1/replicas", timeout=5).json())

        wait_until(lambda: all((r.get("process") or {}).get("pid") for r in engines()), 30,
                   what="the engines' processes read")
        for replica in engines():
            # The engine's parent is the container's monitor (conmon), not the agent.
            parent = psutil.Process(replica["process"]["pid"]).parent()
            assert parent is not None and parent.name() == "conmon", replica
        time.sleep(10)  # under the demo's load
    timeline = _timeline(tmp_path)
    assert timeline["load"]["requests_ok"] > 0
    assert timeline["load"]["requests_failed"] == 0
