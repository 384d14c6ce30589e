"""The SGLang face's /metrics against SGLang's own: the capture in tests/fixtures/sglang-0.5.23 (its collectors'
output, two data-parallel ranks of two tensor-parallel ranks) is the reference for every family's type, label names
and bucket bounds."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from enginesim.clock import VirtualClock
from enginesim.sglang import SglangOptions
from tests.sim.inprocess import InProcessSglang, inprocess_sglang

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.23" / "metrics.txt"
MODEL = "test-model"

# Families SGLang exports that the simulator leaves out, each for its reason. Adding one here is deliberate; the
# test fails on any family of the capture that is neither simulated nor listed.
NOT_SIMULATED: dict[str, set[str]] = {
    "speculative decoding (not simulated)": {
        "sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_block_accept_length",
        "sglang:spec_cap_length", "sglang:spec_num_draft_tokens", "sglang:spec_num_steps"},
    "prefill/decode disaggregation (the simulator is one unified engine)": {
        "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
        "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
        "sglang:num_decode_host_receive_queue_reqs", "sglang:num_decode_deferred_kv_release_reqs",
        "sglang:pending_prealloc_token_usage", "sglang:prealloc_full_token_usage", "sglang:prealloc_swa_token_usage"},
    "hybrid sliding-window and Mamba pools (the simulated models are dense)": {
        "sglang:swa_token_usage", "sglang:swa_available_tokens", "sglang:swa_evictable_tokens",
        "sglang:swa_used_tokens", "sglang:mamba_usage", "sglang:mamba_available_tokens",
        "sglang:mamba_evictable_tokens", "sglang:mamba_used_tokens"},
    "data-parallel attention (--enable-dp-attention, not simulated)": {
        "sglang:dp_attention_tokens", "sglang:dp_attention_pairs", "sglang:dp_attention_steps",
        "sglang:dp_attention_token_imbalance_ratio", "sglang:dp_attention_sync_wait_seconds"},
    "routing keys of a request router in front (none here)": {
        "sglang:num_unique_running_routing_keys", "sglang:routing_key_running_req_count",
        "sglang:routing_key_all_req_count", "sglang:routing_keys_active"},
    "structured output (no grammars)": {"sglang:num_grammar_queue_reqs"},
    "CUDA graphs and device memory at start-up (no device)": {
        "sglang:is_cuda_graph", "sglang:cuda_graph_passes", "sglang:graph_memory_usage_gb",
        "sglang:weight_memory_usage_gb", "sglang:kv_cache_memory_usage_gb", "sglang:startup_available_gpu_memory_gb",
        "sglang:startup_time_seconds", "sglang:startup_cuda_graph_time_seconds"},
    "the server's own processes and loop timings (the simulator is one process)": {
        "sglang:process_cpu_seconds", "sglang:scheduler_idle_seconds", "sglang:scheduler_process_cpu_seconds",
        "sglang:scheduler_stage_seconds", "sglang:per_stage_req_latency_seconds", "sglang:fwd_occupancy",
        "sglang:utilization", "sglang:new_token_ratio"},
    "per-process gauges labelled by pid (Pitstop reads sglang:num_retracted_requests_total)": {
        "sglang:num_retracted_reqs", "sglang:num_paused_reqs"},
}


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("sglang:")}


def label_names(family: Metric) -> set[str]:
    names = {name for sample in family.samples for name in sample.labels}
    return names - {"le"} if family.type == "histogram" else names


def bounds(family: Metric) -> list[float]:
    """The bucket bounds of the family's first series."""
    first = next(s for s in family.samples if s.name.endswith("_bucket"))
    key = {k: v for k, v in first.labels.items() if k != "le"}
    return [float(s.labels["le"]) for s in family.samples
            if s.name.endswith("_bucket") and {k: v for k, v in s.labels.items() if k != "le"} == key]


async def _traffic(sim: InProcessSglang) -> None:
    """Enough of everything that each simulated family has a series: streams and plain requests, a prompt seen
    twice on one rank, a client that goes away, and more KV than a rank holds (a retraction)."""
    prompt = "the same long system prompt " * 40
    for stream in (True, False, True):  # round robin: the first and third land on one rank
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": stream}
        assert (await sim.client.post("/v1/completions", json=body)).status_code == 200
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    assert (await sim.client.post("/v1/chat/completions", json=chat)).status_code == 200
    gone = sim.engine.submit(prompt_tokens=20, max_tokens=50, ignore_eos=True)
    sim.engine.abort(gone)
    for _ in range(12):  # 6 per rank x 900 tokens > the 4096 a tiny-cpu rank holds
        sim.engine.submit(prompt_tokens=500, max_tokens=400, ignore_eos=True)
    await sim.engine.wait_idle()


def scrape(options: SglangOptions, **overrides: object) -> str:
    async def go() -> str:
        async with inprocess_sglang(options, clock=VirtualClock(), **overrides) as sim:
            await _traffic(sim)
            response = await sim.client.get("/metrics")
            assert response.status_code == 200
            return response.text
    return asyncio.run(go())


def test_every_readable_family_of_sglangs_own_capture_has_its_type_labels_and_buckets() -> None:
    real = families(CAPTURE.read_text())
    simulated = families(scrape(SglangOptions(enable_metrics=True, dp_size=2), tensor_parallel_size=2))
    left_out = set().union(*NOT_SIMULATED.values())
    assert left_out <= set(real), sorted(left_out - set(real))  # the list names only families SGLang has
    assert set(simulated) - set(real) == set(), "the simulator invents no family"
    assert set(real) - left_out - set(simulated) == set(), "every other family of the capture is simulated"
    for name, family in simulated.items():
        assert family.type == real[name].type, name
        assert label_names(family) == label_names(real[name]), name
        if family.type == "histogram":
            assert bounds(family) == bounds(real[name]), name
    assert bounds(simulated["sglang:time_to_first_token_seconds"])[0] == 0.1
    # No _created series: SGLang serves its metrics through prometheus_client's multiprocess collector.
    assert not [s for f in simulated.values() for s in f.samples if s.name.endswith("_created")]


def test_scheduler_series_are_per_data_parallel_rank_and_reported_by_tensor_parallel_rank_0() -> None:
    simulated = families(scrape(SglangOptions(enable_metrics=True, dp_size=2), tensor_parallel_size=2))
    running = {(s.labels["dp_rank"], s.labels["tp_rank"]) for s in simulated["sglang:num_running_reqs"].samples}
    assert running == {("0", "0"), ("1", "0")}
    seeded = {(s.labels["dp_rank"], s.labels["tp_rank"])
              for s in simulated["sglang:prefill_effective_tokens"].samples}
    assert seeded == {(dp, tp) for dp in "01" for tp in "01"}  # every scheduler pre-creates these, rank 1 too
    assert "dp_rank" not in label_names(simulated["sglang:generation_tokens"])  # the server's, not a rank's


def test_one_scheduler_has_no_dp_rank_label_and_the_ttft_buckets_follow_the_flag() -> None:
    options = SglangOptions(enable_metrics=True, ttft_buckets=(0.05, 0.5, 5.0))
    simulated = families(scrape(options))
    assert label_names(simulated["sglang:num_running_reqs"]) == {"model_name", "engine_type", "tp_rank", "pp_rank",
                                                                 "moe_ep_rank"}
    assert bounds(simulated["sglang:time_to_first_token_seconds"]) == [0.05, 0.5, 5.0, float("inf")]


def test_tokens_and_requests_are_counted_when_requests_finish() -> None:
    async def go() -> None:
        async with inprocess_sglang(clock=VirtualClock()) as sim:
            body = {"model": MODEL, "prompt": "count me", "max_tokens": 7, "ignore_eos": True}
            streamed = {**body, "stream": True}
            usage = (await sim.client.post("/v1/completions", json=body)).json()["usage"]
            await sim.client.post("/v1/completions", json=streamed)
            value = sim.registry.get_sample_value
            labels = {"model_name": MODEL, "engine_type": "unified"}
            for streaming in ("true", "false"):
                flagged = {**labels, "is_streaming": streaming}
                assert value("sglang:generation_tokens_total", flagged) == 7
                assert value("sglang:prompt_tokens_total", flagged) == usage["prompt_tokens"]
                assert value("sglang:num_requests_total", flagged) == 1
                assert value("sglang:time_to_first_token_seconds_count", flagged) == 1
            assert value("sglang:inter_token_latency_seconds_count", labels) == 2 * 6
            ranks = {**labels, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
            assert value("sglang:realtime_tokens_total", {**ranks, "mode": "decode"}) == 2 * 6
            assert value("sglang:num_running_reqs", ranks) == 0  # the emptied batch is reported at once
    asyncio.run(go())


def test_metrics_are_not_served_without_enable_metrics() -> None:
    async def go() -> None:
        async with inprocess_sglang(SglangOptions()) as sim:
            response = await sim.client.get("/metrics")
            assert response.status_code == 404
            assert response.json() == {"detail": "Not Found"}
            assert (await sim.client.get("/v1/models")).json()["data"][0]["owned_by"] == "sglang"
    asyncio.run(go())


def test_the_error_rate_fault_shows_as_http_500s() -> None:
    async def go() -> None:
        async with inprocess_sglang() as sim:
            sim.ctx.error_rate = 1.0
            body = {"model": MODEL, "prompt": "fail", "max_tokens": 2}
            assert (await sim.client.post("/v1/completions", json=body)).status_code == 500
            value = sim.registry.get_sample_value("sglang:http_responses_total", {
                "endpoint": "/v1/completions", "method": "POST", "status_code": "500"})
            assert value == 1
    asyncio.run(go())


def test_a_scrape_may_ask_for_families_by_name() -> None:
    async def go() -> None:
        async with inprocess_sglang(clock=VirtualClock()) as sim:
            await sim.client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
            wanted = ["sglang:num_running_reqs", "sglang:generation_tokens_total"]
            text = (await sim.client.get("/metrics", params=[("name[]", n) for n in wanted])).text
            assert set(families(text)) == {"sglang:num_running_reqs", "sglang:generation_tokens"}
    asyncio.run(go())
