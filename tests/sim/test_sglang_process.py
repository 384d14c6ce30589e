"""The SGLang face as a real process: its running limit under load, SIGTERM's drain, a hang failing
/health_generate until the watchdog kills the server, and a dead scheduler taking the server down."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.http import probe
from tests.helpers import wait_until
from tests.sim.conftest import SimProcess, StartSim
from tests.sim.streams import StreamRecord, stream_chat

pytestmark = pytest.mark.slow
SGLANG = ("--engine", "sglang", "--enable-metrics")


def running(sim: SimProcess) -> float:
    """The scheduler's running gauge (one data-parallel rank)."""
    for family in text_string_to_metric_families(probe.get(sim.url + "/metrics").text):
        if family.name == "sglang:num_running_reqs":
            (sample,) = family.samples
            return float(sample.value)
    raise AssertionError("sglang:num_running_reqs not exported")


def streams(sim: SimProcess, count: int, max_tokens: int) -> tuple[list[threading.Thread], list[StreamRecord]]:
    out: list[StreamRecord] = []
    threads = [threading.Thread(target=lambda: out.append(stream_chat(sim.url, max_tokens)), daemon=True)
               for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, out


def start_faults_now(clock_file: Path) -> None:
    """The faults of a server started with ``--fault-clock-file`` count from now on."""
    clock_file.write_text(f"{time.time()}\n")


def test_max_running_requests_bounds_the_running_gauge_under_load(start_sim: StartSim) -> None:
    sim = start_sim(*SGLANG, "--max-running-requests", "3", ready="/ready")
    threads, out = streams(sim, 9, 200)
    seen: list[float] = []

    def sample() -> bool:
        seen.append(running(sim))
        return seen[-1] == 3

    wait_until(sample, 30, interval=0.02, what="three requests running")
    while any(t.is_alive() for t in threads):
        seen.append(running(sim))
        time.sleep(0.02)
    assert max(seen) == 3, seen
    assert len(out) == 9 and all(r.done and len(r.token_times) == 200 for r in out)
    assert running(sim) == 0


def test_sigterm_drains_in_flight_requests_with_no_timeout_then_exits_0(start_sim: StartSim) -> None:
    sim = start_sim(*SGLANG, ready="/ready")
    threads, out = streams(sim, 1, 1500)  # long enough to be in flight through the checks below
    wait_until(lambda: running(sim) == 1, 15, what="the stream running")
    sim.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: probe.get(sim.url + "/health", timeout=5).status_code == 503, 15,
               what="/health answering 503 while draining")
    late = probe.post(sim.url + "/v1/completions", timeout=15,
                      json={"model": "test-model", "prompt": "late", "max_tokens": 3})
    assert late.status_code == 200  # SGLang goes on taking requests while it drains
    threads[0].join(60)
    assert out and out[0].done and len(out[0].token_times) == 1500
    assert sim.proc.wait(timeout=30) == 0
    assert "SIGTERM received" in sim.output() and "Draining: " in sim.output()


def test_a_hang_fails_health_generate_then_the_watchdog_kills_the_server(start_sim: StartSim, tmp_path: Path) -> None:
    clock = tmp_path / "fault-clock"
    sim = start_sim(*SGLANG, "--fault-hang-after", "0", "--fault-clock-file", str(clock), "--watchdog-timeout", "2",
                    env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}, ready="/ready")
    assert probe.get(sim.url + "/health_generate", timeout=15).status_code == 200
    start_faults_now(clock)
    wait_until(lambda: probe.get(sim.url + "/health_generate", timeout=15).status_code == 503, 60,
               what="/health_generate failing on the hung engine")
    assert probe.get(sim.url + "/get_model_info").status_code == 200  # the HTTP server itself still answers
    streams(sim, 1, 50)  # a batch that never advances: what the watchdog watches for
    assert sim.proc.wait(timeout=60) == -signal.SIGKILL
    assert "watchdog timeout" in sim.output()


def test_a_dead_scheduler_takes_the_server_down_by_sigkill(start_sim: StartSim, tmp_path: Path) -> None:
    clock = tmp_path / "fault-clock"
    sim = start_sim(*SGLANG, "--fault-crash-after", "0", "--fault-clock-file", str(clock), ready="/ready")
    start_faults_now(clock)
    assert sim.proc.wait(timeout=30) == -signal.SIGKILL
    assert "Scheduler died (injected fault: crash)" in sim.output()
    assert not list(sim.gpu_dir.glob("gpu*.json"))
