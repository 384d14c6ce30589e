"""The simulator as a real process: cold start, streaming, TTFT agreement, flags, SIGTERM semantics."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.http import probe
from tests.helpers import free_port, http_ok, wait_until
from tests.sim.conftest import StartSim
from tests.sim.streams import StreamRecord, stream_chat

# Client-side timings are compared with the engine's own to milliseconds: alone, on a quiet machine.
pytestmark = [pytest.mark.slow, pytest.mark.solo]
LABELS = {"model_name": "test-model", "engine": "0"}


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    want = labels or LABELS
    for family in text_string_to_metric_families(probe.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels == want:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


def in_thread(fn: Callable[..., StreamRecord], *args: Any, **kwargs: Any) -> tuple[threading.Thread,
                                                                                    list[StreamRecord]]:
    out: list[StreamRecord] = []
    t = threading.Thread(target=lambda: out.append(fn(*args, **kwargs)), daemon=True)
    t.start()
    return t, out


def test_cold_start_refuses_connections_then_warms_up(start_sim: StartSim) -> None:
    sim = start_sim("--trust-remote-code", "--pipeline-parallel-size", "1", "--dtype=bfloat16",
                    wait=False, startup=1.5)
    time.sleep(0.8)
    with pytest.raises(httpx.ConnectError):
        probe.get(sim.url + "/health", timeout=1)
    sim.wait_ready()
    log = sim.output()
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1
    assert all(f in warnings[0] for f in ("--trust-remote-code", "--pipeline-parallel-size", "--dtype"))
    body = {"model": "test-model", "prompt": "warm me up", "max_tokens": 40, "ignore_eos": True}
    durations = []
    for _ in range(4):
        t0 = time.monotonic()
        assert probe.post(sim.url + "/v1/completions", json=body, timeout=10).status_code == 200
        durations.append(time.monotonic() - t0)
    assert durations[0] > 2 * durations[-1], durations  # the first requests run on a cold engine


def test_stream_shape_and_ttft_agree_with_the_client(start_sim: StartSim) -> None:
    sim = start_sim()
    with httpx.Client() as client:
        client.get(sim.url + "/v1/models")  # connection and first-request set-up, outside the measurement
        rec = stream_chat(sim.url, 12, client=client, stream_options={"include_usage": True})
        assert rec.done and rec.status == 200
        assert rec.chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert len(rec.token_times) == 12
        assert rec.chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert rec.chunks[-1]["choices"] == [] and rec.chunks[-1]["usage"]["completion_tokens"] == 12
        assert metric(sim.url, "vllm:generation_tokens_total") == 12
        assert metric(sim.url, "vllm:request_success_total", {**LABELS, "finished_reason": "length"}) == 1
        gaps = []
        reported_before = metric(sim.url, "vllm:time_to_first_token_seconds_sum")
        gaps.append(abs(reported_before - rec.ttft))
        for n in range(2, 5):
            rec = stream_chat(sim.url, 3, client=client)
            assert metric(sim.url, "vllm:time_to_first_token_seconds_count") == n
            reported = metric(sim.url, "vllm:time_to_first_token_seconds_sum")
            gaps.append(abs(reported - reported_before - rec.ttft))
            reported_before = reported
    # The server observes TTFT when it writes the first token; the client when it reads it. A busy host may
    # delay one read, so the closest of four requests must agree within a few milliseconds.
    assert min(gaps) < 0.005, gaps
    assert sorted(gaps)[1] < 0.015, gaps


def test_sigterm_with_zero_timeout_aborts_streams_at_once(start_sim: StartSim) -> None:
    sim = start_sim()
    thread, out = in_thread(stream_chat, sim.url, 1500)
    wait_until(lambda: metric(sim.url, "vllm:num_requests_running") == 1, 5, what="request running")
    sim.terminate()
    assert sim.proc.wait(timeout=5) == 0
    thread.join(5)
    assert out and not out[0].done  # the stream ended without [DONE]
    assert not list(sim.gpu_dir.glob("gpu*.json"))


def test_sigterm_with_timeout_drains_in_flight_and_refuses_new(start_sim: StartSim) -> None:
    sim = start_sim("--shutdown-timeout", "10")
    thread, out = in_thread(stream_chat, sim.url, 150)
    wait_until(lambda: metric(sim.url, "vllm:num_requests_running") == 1, 5, what="request running")
    sim.terminate()
    time.sleep(0.2)
    assert http_ok(sim.url + "/health")  # vLLM keeps /health 200 while it drains
    refused = probe.post(sim.url + "/v1/completions", json={"model": "test-model", "prompt": "late"})
    assert refused.status_code == 500
    thread.join(15)
    assert out and out[0].done and len(out[0].token_times) == 150
    assert sim.proc.wait(timeout=5) == 0


def test_port_in_use_fails_start(start_sim: StartSim) -> None:
    first = start_sim()
    port = first.port
    second = start_sim("--port", str(port), wait=False)
    assert second.proc.wait(timeout=10) != 0
    assert free_port() != port


def test_client_disconnect_aborts_the_request_and_frees_its_kv(start_sim: StartSim) -> None:
    sim = start_sim()
    body = {"model": "test-model", "messages": [{"role": "user", "content": "go"}], "max_tokens": 1500,
            "stream": True, "ignore_eos": True}
    with httpx.Client() as client, client.stream("POST", sim.url + "/v1/chat/completions", json=body) as resp:
        for n, _ in enumerate(resp.iter_lines()):
            if n > 5:
                break
    wait_until(lambda: metric(sim.url, "vllm:num_requests_running") == 0, 5, what="request aborted")
    assert metric(sim.url, "vllm:kv_cache_usage_perc") == 0
    assert metric(sim.url, "vllm:request_success_total", {**LABELS, "finished_reason": "abort"}) == 1
