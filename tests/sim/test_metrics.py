"""/metrics reads like vLLM 0.33's: names, kinds, labels, buckets, and values that match what was served."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

import enginesim
from enginesim.metrics import REQUEST_TIME_BUCKETS
from tests.sim.inprocess import InProcessSim, inprocess_sim

TSV = Path(enginesim.__file__).parent / "data" / "vllm-metrics.tsv"
REQUIRED = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc", "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success", "vllm:iteration_tokens_total",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
]
# Copied from docs/design.md (vLLM 0.33's buckets), independent of the code's table.
DESIGN_BUCKETS = {
    "vllm:time_to_first_token_seconds": ".001 .005 .01 .02 .04 .06 .08 .1 .25 .5 .75 1 2.5 5 7.5 10 20 40 80 160 "
                                        "640 2560",
    "vllm:inter_token_latency_seconds": ".01 .025 .05 .075 .1 .15 .2 .3 .4 .5 .75 1 2.5 5 7.5 10 20 40 80",
    "vllm:e2e_request_latency_seconds": ".3 .5 .8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680",
}
for name in ("queue", "prefill", "decode"):
    DESIGN_BUCKETS[f"vllm:request_{name}_time_seconds"] = DESIGN_BUCKETS["vllm:e2e_request_latency_seconds"]
LABELS = {"model_name": "test-model", "engine": "0"}


def vllm_table() -> dict[str, tuple[str, str]]:
    rows = [r for r in csv.reader(TSV.read_text().splitlines(), delimiter="\t") if r and not r[0].startswith("#")]
    return {r[0]: (r[1], r[2] if len(r) > 2 else "") for r in rows[1:]}


async def scrape(sim: InProcessSim) -> dict[str, Metric]:
    text = (await sim.client.get("/metrics")).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_families_names_kinds_labels_and_buckets_match_vllm() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            await sim.client.post("/v1/completions", json={"model": "test-model", "prompt": "hi", "max_tokens": 3})
            families = await scrape(sim)
        table = vllm_table()
        assert set(REQUIRED) <= set(families)
        assert "process_resident_memory_bytes" in families  # vLLM's registry has the process collector
        for name, family in families.items():
            if not name.startswith("vllm:"):
                continue
            if name.endswith("_created") and name.removesuffix("_created") in families:
                continue  # the text parser splits a counter's _created series off as its own gauge
            assert name in table, f"{name} is not a vLLM 0.33 family"
            kind, labels = table[name]
            assert family.type == kind, name
            if labels.startswith("labelnames"):
                extra = labels.split("['")[1].split("']")[0] if "+" in labels else None
                expected = {"model_name", "engine", *([extra] if extra else [])}
                for sample in family.samples:
                    assert set(sample.labels) - {"le"} == expected, (name, sample)
        for name, buckets in DESIGN_BUCKETS.items():
            les = [s.labels["le"] for s in families[name].samples if s.name.endswith("_bucket")]
            assert [float(x) for x in les[:-1]] == [float(b) for b in buckets.split()], name
            assert les[-1] == "+Inf"
        assert REQUEST_TIME_BUCKETS[-1] == 7680.0
        text_names = {s.name for f in families.values() for s in f.samples}
        assert {"vllm:request_success_total", "vllm:request_success_created"} <= text_names
    asyncio.run(go())


def test_counters_match_what_was_served() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            prompt_sum = completion_sum = 0
            for i in range(5):
                r = await sim.client.post("/v1/chat/completions", json={
                    "model": "test-model", "messages": [{"role": "user", "content": f"question {i} " * 5}],
                    "max_tokens": 20})
                usage = r.json()["usage"]
                prompt_sum += usage["prompt_tokens"]
                completion_sum += usage["completion_tokens"]
            await sim.client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
            reg = sim.ctx.registry
            success = sum(reg.get_sample_value("vllm:request_success_total", {**LABELS, "finished_reason": r}) or 0
                          for r in ("stop", "length", "abort", "error", "repetition"))
            assert success == 5
            assert reg.get_sample_value("vllm:generation_tokens_total", LABELS) == completion_sum
            assert reg.get_sample_value("vllm:prompt_tokens_total", LABELS) == prompt_sum
            assert reg.get_sample_value("vllm:e2e_request_latency_seconds_count", LABELS) == 5
            assert reg.get_sample_value("vllm:time_to_first_token_seconds_count", LABELS) == 5
            assert reg.get_sample_value("vllm:request_generation_tokens_sum", LABELS) == completion_sum
            assert reg.get_sample_value("vllm:num_requests_running", LABELS) == 0
            assert reg.get_sample_value("vllm:kv_cache_usage_perc", LABELS) == 0
    asyncio.run(go())


def test_repeated_prompt_hits_the_prefix_cache() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            body = {"model": "test-model", "prompt": "shared system prompt " * 20, "max_tokens": 2}
            await sim.client.post("/v1/completions", json=body)
            await sim.client.post("/v1/completions", json=body)
            reg = sim.ctx.registry
            assert reg.get_sample_value("vllm:prefix_cache_queries_total", LABELS) == 2 * 105
            assert reg.get_sample_value("vllm:prefix_cache_hits_total", LABELS) == 96  # whole 16-token blocks
    asyncio.run(go())


def test_shared_system_prompt_hits_the_prefix_cache_across_conversations() -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 20}  # 145 tokens + 4

    async def go() -> None:
        async with inprocess_sim() as sim:
            for question in ("first question", "a different question"):
                await sim.client.post("/v1/chat/completions", json={
                    "model": "test-model", "max_tokens": 2,
                    "messages": [system, {"role": "user", "content": question}]})
            hits = sim.ctx.registry.get_sample_value("vllm:prefix_cache_hits_total", LABELS)
            assert hits == 144  # the system message's 149 tokens, in whole 16-token blocks
    asyncio.run(go())


REAL_CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-cpu" / "metrics-warm.txt"
# Families a real vLLM serves that the simulator leaves out: features it does not simulate (sleep mode,
# external and multimodal caches, prompt sources, admission control, FLOP estimates). Adding one is deliberate.
NOT_SIMULATED = {
    "vllm:engine_sleep_state", "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
    "vllm:mm_cache_queries", "vllm:mm_cache_hits", "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens_cached_by_source", "vllm:admission_rejections", "vllm:request_prefill_kv_computed_tokens",
    "vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu", "vllm:estimated_write_bytes_per_gpu",
}


def _vllm_families(text: str) -> dict[str, Metric]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {n: f for n, f in families.items()
            if n.startswith("vllm:") and not (n.endswith("_created") and n.removesuffix("_created") in families)}


def _bounds(family: Metric) -> list[str]:
    return [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]


def test_family_set_matches_a_recorded_real_vllm_scrape() -> None:
    async def go() -> str:
        async with inprocess_sim() as sim:
            await sim.client.post("/v1/completions", json={"model": "test-model", "prompt": "hi", "max_tokens": 3})
            return (await sim.client.get("/metrics")).text

    text = asyncio.run(go())
    simulated, real = _vllm_families(text), _vllm_families(REAL_CAPTURE.read_text())
    all_simulated = {f.name for f in text_string_to_metric_families(text)}
    assert set(simulated) - set(real) == set()
    assert set(real) - set(simulated) == NOT_SIMULATED
    by_max_model_len = {"vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                        "vllm:request_max_num_generation_tokens", "vllm:request_params_max_tokens"}
    for name, family in simulated.items():
        assert family.type == real[name].type, name
        if family.type == "histogram" and name not in by_max_model_len:
            assert _bounds(family) == _bounds(real[name]), name
        # Histograms carry _count, _sum, _bucket and a _created series, as vLLM's do (counters _total too).
        if family.type in ("histogram", "counter"):
            assert {s.name for s in family.samples} == {s.name for s in real[name].samples}, name
            assert f"{name}_created" in all_simulated, name
    preempted = simulated["vllm:request_num_preemptions"]
    assert {s.name for s in preempted.samples} == {"vllm:request_num_preemptions_bucket",
                                                   "vllm:request_num_preemptions_count",
                                                   "vllm:request_num_preemptions_sum"}
    assert _bounds(preempted) == ["1.0", "2.0", "3.0", "4.0", "5.0", "10.0", "20.0", "+Inf"]
    count = next(s.value for s in preempted.samples if s.name.endswith("_count"))
    assert count == 1  # the one request, finished without a preemption


def test_a_one_token_answer_is_in_the_ttft_histogram_even_when_the_client_closes_on_it() -> None:
    """vLLM records TTFT as it processes the engine's output (``IterationStats.update_from_output``, for every
    output of a prefilling request), so a request whose first token is its last is counted. A client that
    closes the stream once it reads ``finish_reason`` (as the agent's canary does) must not take it away."""
    async def go() -> None:
        async with inprocess_sim() as sim:
            body = json.dumps({"model": "test-model", "prompt": "ping", "max_tokens": 1, "stream": True}).encode()
            scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                     "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                     "query_string": b"", "root_path": "", "server": ("sim", 80), "client": ("127.0.0.1", 1),
                     "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
            first_token = asyncio.Event()
            asked = 0

            async def receive() -> dict[str, object]:
                nonlocal asked
                asked += 1
                if asked == 1:
                    return {"type": "http.request", "body": body, "more_body": False}
                await first_token.wait()  # the client reads the one token, sees finish_reason, and is gone
                return {"type": "http.disconnect"}

            async def send(message: dict[str, object]) -> None:
                if message["type"] == "http.response.body" and b'"finish_reason":"length"' in bytes(
                        message.get("body", b"")):  # type: ignore[arg-type]
                    first_token.set()
                    await asyncio.sleep(0.05)  # the disconnect arrives before the stream goes on

            await sim.app(scope, receive, send)  # type: ignore[arg-type]
            assert first_token.is_set(), "the one token never came"
            count = sim.ctx.registry.get_sample_value("vllm:time_to_first_token_seconds_count", LABELS)
            assert count == 1
    asyncio.run(go())
