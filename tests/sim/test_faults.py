"""Each injected fault observably happens in a real simulator process."""

from __future__ import annotations

import json
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.http import probe
from tests.helpers import http_ok, wait_until
from tests.sim.conftest import StartSim
from tests.sim.streams import stream_chat
from tests.sim.test_process import LABELS, in_thread, metric

pytestmark = pytest.mark.slow


def test_rss_leak_grows_real_memory(start_sim: StartSim) -> None:
    sim = start_sim("--fault-leak-rss-mb-per-min", "1200")  # 20 MiB a second
    proc = psutil.Process(sim.proc.pid)
    before = proc.memory_info().rss
    time.sleep(2.5)
    grown = proc.memory_info().rss - before
    assert grown > 30 * 2**20, grown


def vllm_series(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every ``vllm:`` sample of one /metrics scrape, by name and labels."""
    response = probe.get(url + "/metrics")
    assert response.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples
            if s.name.startswith("vllm:")}


@pytest.mark.parametrize("gauges", ["zero", "last"])
def test_hung_engine_stays_healthy_but_publishes_nothing(start_sim: StartSim, gauges: str) -> None:
    # vllm#39863, as measured on vLLM 0.32 with its EngineCore frozen: /health and /metrics answer, requests are
    # taken and never answered, and the core's gauges and counters stop (running/waiting at 0, or as they were).
    flags = ["--fault-hang-gauges", "last"] if gauges == "last" else []  # zero is the default
    sim = start_sim("--fault-hang-after", "2", "--max-num-seqs", "1", *flags)
    listening = time.monotonic()  # no earlier than the server started listening, where the 2 s count from
    # One stream decoding and one queued behind it (max-num-seqs 1) when the hang comes; both give up 2 s into it.
    before = [in_thread(stream_chat, sim.url, 1500, timeout=2.0) for _ in range(2)]
    wait_until(lambda: metric(sim.url, "vllm:num_requests_running") == 1
               and metric(sim.url, "vllm:num_requests_waiting") == 1, 2, interval=0.05, what="one running, one queued")
    seen: list[float] = []

    def tokens_stopped() -> bool:
        seen.append(metric(sim.url, "vllm:generation_tokens_total"))
        # A live tiny-cpu engine moves tokens every few ms; past 2 s a pause is the hang, not a starved host.
        return time.monotonic() - listening > 2 and len(seen) > 1 and seen[-1] == seen[-2]

    wait_until(tokens_stopped, 10, interval=0.2, what="the hang")
    frozen = vllm_series(sim.url)
    held = 0.0 if gauges == "zero" else 1.0
    assert metric(sim.url, "vllm:num_requests_running") == held
    assert metric(sim.url, "vllm:num_requests_waiting") == held

    late = stream_chat(sim.url, 20, timeout=1.0)  # accepted, 200 headers, then no token within the timeout
    assert late.status == 200 and late.token_times == [] and not late.done and late.error == "ReadTimeout"
    with pytest.raises(httpx.ReadTimeout):
        probe.post(sim.url + "/v1/completions", timeout=0.5,
                   json={"model": "test-model", "prompt": "hello", "max_tokens": 5})
    assert http_ok(sim.url + "/health")  # vllm#39863: /health says nothing about progress
    assert vllm_series(sim.url) == frozen  # new requests moved no gauge, counter or histogram
    for thread, out in before:
        thread.join(5)
        assert out and not out[0].done and out[0].error == "ReadTimeout"
    assert vllm_series(sim.url) == frozen  # nor did the clients that gave up
    assert http_ok(sim.url + "/health")


@pytest.mark.solo  # the crash comes a wall-clock second after the start: the stream must be flowing by then
def test_crash_breaks_streams_and_exits_nonzero(start_sim: StartSim) -> None:
    sim = start_sim("--fault-crash-after", "1.0")
    thread, out = in_thread(stream_chat, sim.url, 1500)
    assert sim.proc.wait(timeout=10) != 0
    thread.join(5)
    assert out and not out[0].done and out[0].token_times  # it was streaming, then it broke
    assert "EngineCore died" in sim.output()


def test_fail_start_from_environment_exits_before_ready(start_sim: StartSim) -> None:
    sim = start_sim(wait=False, env={"PITSTOP_SIM_FAULT_FAIL_START": "1"}, startup=0.5)
    assert sim.proc.wait(timeout=10) != 0
    assert "Application startup complete" not in sim.output()


def test_error_rate_answers_that_share_with_500(start_sim: StartSim) -> None:
    sim = start_sim("--fault-error-rate", "0.3", "--sim-seed", "7")
    body = {"model": "test-model", "prompt": "hello", "max_tokens": 1}
    with httpx.Client(base_url=sim.url) as client:
        codes = [client.post("/v1/completions", json=body).status_code for _ in range(100)]
    failures = codes.count(500)
    assert 15 <= failures <= 45, failures
    assert codes.count(200) == 100 - failures
    assert metric(sim.url, "vllm:request_success_total", {**LABELS, "finished_reason": "error"}) == failures


def test_cuda_oom_when_one_request_outgrows_the_kv_cache(start_sim: StartSim) -> None:
    # 0.6 of the tiny profile's 2 GiB leaves 1024 tokens of KV; this request grows to 1150.
    sim = start_sim("--gpu-memory-utilization", "0.6")
    response = probe.post(sim.url + "/v1/completions", timeout=20, json={
        "model": "test-model", "prompt": "x" * 4000, "max_tokens": 150, "ignore_eos": True})
    assert response.status_code == 500
    assert sim.proc.wait(timeout=10) != 0
    assert "CUDA out of memory" in sim.output()


def test_gpu_files_xid_heat_and_vram_leak(start_sim: StartSim) -> None:
    sim = start_sim("--fault-xid-after", "0.3", "--fault-xid-code", "79,45", "--fault-hot-gpu-after", "0.3",
                    "--fault-leak-gpu-mb-per-min", "6000", env={"CUDA_VISIBLE_DEVICES": "2,3"})
    pid = sim.proc.pid
    paths = [sim.gpu_dir / f"gpu{i}-{pid}.json" for i in (2, 3)]
    wait_until(lambda: all(p.exists() for p in paths), 5, what="GPU files")
    first = json.loads(paths[0].read_text())
    assert first["uuid"].startswith("GPU-sim-") and first["uuid"].endswith("-2")
    assert first["pid"] == pid and first["gpu_index"] == 2
    assert first["name"] and first["memory_total_bytes"] > first["memory_used_bytes"] > 0

    def hot_with_xid() -> bool:
        r = json.loads(paths[1].read_text())
        return r["temperature_celsius"] > r["slowdown_temperature_celsius"] and bool(r["xid_events"])

    wait_until(hot_with_xid, 10, what="hot GPU with an XID event")
    last = json.loads(paths[0].read_text())
    # Two codes at one instant, as a failing GPU logs them: the agent's next read carries both.
    assert [e["code"] for e in last["xid_events"]] == [79, 45]
    assert last["xid_events"][0]["at"] == last["xid_events"][1]["at"]
    assert "Xid (PCI:0000:00:00): 79" in sim.output() and "Xid (PCI:0000:00:00): 45" in sim.output()
    assert last["memory_used_bytes"] > first["memory_used_bytes"]  # simulated VRAM leak
    assert last["updated_at"] > first["updated_at"]
    sim.terminate()
    assert sim.proc.wait(timeout=5) == 0
    assert not any(p.exists() for p in paths)


def test_slow_all_reduce_raises_itl_until_the_custom_kernel_is_disabled(start_sim: StartSim) -> None:
    slow = start_sim("-tp", "2", env={"PITSTOP_SIM_FAULT_SLOW_ALL_REDUCE_MS": "100"})
    nccl = start_sim("-tp", "2", "--disable-custom-all-reduce", env={"PITSTOP_SIM_FAULT_SLOW_ALL_REDUCE_MS": "100"})
    body = {"model": "test-model", "prompt": "hello", "max_tokens": 10, "ignore_eos": True}

    def mean_itl(url: str) -> float:
        assert probe.post(url + "/v1/completions", json=body, timeout=20).status_code == 200
        total = metric(url, "vllm:inter_token_latency_seconds_sum")
        return total / metric(url, "vllm:inter_token_latency_seconds_count")

    slow_itl, nccl_itl = mean_itl(slow.url), mean_itl(nccl.url)
    assert nccl_itl < 0.05 and 0.09 < slow_itl - nccl_itl < 0.2, (slow_itl, nccl_itl)
    assert "+100 ms per step: slow all-reduce fault" in slow.output()
    assert "all-reduce: NCCL" in nccl.output()
