"""Engine adapters: each engine's knowledge in its adapter, and the agent and the governor reading it."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import ConfigError, parse_config
from agent.engine_metrics import engine_sample, parse_metrics
from agent.probes import served_model_name
from agent.wire import EngineSample
from controlplane.policy.engine_args import flags_key, governed_limit, spans_gpus
from controlplane.policy.evaluate import evaluate_policy
from controlplane.policy.payloads import GovernedFlag, MaxNumSeqsPayload, governed_flag
from engines import ADAPTERS, DEFAULT_ADAPTER, SGLANG, VLLM, adapter, governed_flags
from engines.sglang import TTFT_BUCKETS
from tests.policy.series import fleet, replica
from tests.policy.test_governor import ITL, breaching, fine

SGLANG_REPLICA = "node: n1\nreplicas:\n  - name: s\n    model: qwen\n    port: 30000\n    engine: sglang\n"


def test_every_adapter_is_complete_and_names_only_its_own_series() -> None:
    for engine in ADAPTERS.values():
        keys = {m.key for m in engine.metrics}
        # What the agent's figures are made of: without these an engine has no readings worth a replica.
        assert {"running", "waiting", "generation_tokens", "requests", "ttft", "itl"} <= keys, engine.name
        assert all(n.startswith(engine.metric_prefix) for m in engine.metrics for n in m.names), engine.name
        assert engine.governed_flag.startswith("--") and engine.governed_flag not in engine.rungs.known
        assert "{model}" in " ".join(engine.command) and "{port}" in engine.command
    assert adapter(None) is DEFAULT_ADAPTER is VLLM and adapter("sglang") is SGLANG
    with pytest.raises(KeyError, match="unknown engine 'tgi'"):
        adapter("tgi")


def test_the_payloads_governed_flags_are_the_adapters() -> None:
    assert set(get_args(GovernedFlag)) == governed_flags()
    assert governed_flag(VLLM) is None  # the stored form of a vLLM change is the one from before engine names
    assert governed_flag(SGLANG) == "--max-running-requests"


def test_an_sglang_change_sets_its_own_flag_and_a_vllm_one_reads_as_before() -> None:
    args = ["--tp-size", "2", "--max-running-requests", "64"]
    change = MaxNumSeqsPayload(kind="lower_max_num_seqs", max_num_seqs=32, previous=64, flag=governed_flag(SGLANG))
    assert change.derive(args) == ["--tp-size", "2", "--max-running-requests", "32"]
    assert change.change == "--max-running-requests 32" and change.needs(args, [0])
    assert governed_limit(change.derive(args)) == 32 and spans_gpus(args, [0])
    vllm = MaxNumSeqsPayload(kind="lower_max_num_seqs", max_num_seqs=32, previous=64)
    assert vllm.derive(["--max-num-seqs", "64"]) == ["--max-num-seqs", "32"]
    assert "flag" not in vllm.model_dump(mode="json")
    # The digest of the other flags is the one samples were stored under before SGLang existed.
    assert flags_key(["--enforce-eager", "--max-num-seqs", "8"]) == flags_key(["--enforce-eager"])
    assert flags_key(["--enforce-eager", "--max-running-requests", "8"]) == flags_key(["--enforce-eager"])


def test_an_sglang_replica_is_started_as_sglang_and_as_the_simulator_speaking_it() -> None:
    [real] = parse_config(SGLANG_REPLICA, "agent.yaml", env={}).replicas
    assert real.adapter is SGLANG and not real.is_simulated
    # Metrics on, and TTFT buckets that hold the shipped TTFT objective's 0.5 s (SGLang's defaults lack it).
    buckets = ["--bucket-time-to-first-token", *TTFT_BUCKETS]
    assert "0.5" in TTFT_BUCKETS
    assert real.argv(["--max-running-requests", "64"]) == [
        "python3", "-m", "sglang.launch_server", "--model-path", "qwen", "--host", "127.0.0.1", "--port", "30000",
        "--enable-metrics", *buckets, "--max-running-requests", "64"]
    [sim] = parse_config(SGLANG_REPLICA + "    simulated: true\n", "agent.yaml", env={}).replicas
    assert sim.argv() == [sys.executable, "-m", "pitstop.cli", "sim", "serve", "qwen", "--host", "127.0.0.1",
                          "--port", "30000", "--engine", "sglang", "--enable-metrics", *buckets]
    config = parse_config(SGLANG_REPLICA, "agent.yaml", env={})
    assert config.engine_env(real, {}) == {}  # SGLang has no keep-alive variable; no simulator's GPU dir
    assert served_model_name("qwen", ["--served-model-name", "q"], SGLANG.served_name_flag) == "q"


@pytest.mark.parametrize(("extra", "line", "field", "says"), [
    ("    shutdown_timeout: 30\n", 7, "shutdown_timeout", "SGLang drains on SIGTERM with no timeout of its own"),
    ("    live_limits: true\n", 7, "live_limits", "live_limits is a vLLM scheduler plug-in; SGLang has none"),
])
def test_what_sglang_cannot_do_is_refused_naming_file_line_and_field(extra: str, line: int, field: str,
                                                                    says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(SGLANG_REPLICA + extra, "agent.yaml", env={})
    assert f"agent.yaml:{line}: replicas.0.{field}: {says}" in str(err.value)


SGLANG_FIXTURE = Path(__file__).parents[1] / "fixtures" / "sglang-0.5.23" / "metrics.txt"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


def _reference(text: str, name: str, **match: str) -> float:
    """A figure as prometheus_client's own parser reads it: the named series summed over data-parallel ranks,
    of tensor rank 0 only where the series has ranks (the others are zeros their collectors made)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == name and labels.get("tp_rank", "0") == "0" and all(
                    labels.get(k) == v for k, v in match.items()):
                total += sample.value
    return total


def test_sglangs_own_metrics_read_as_its_collectors_counted_them() -> None:
    # Captured from SGLang 0.5.23's collectors: --tp-size 2 --dp-size 2, nine requests (one aborted).
    text = SGLANG_FIXTURE.read_text()
    snap = parse_metrics(text, 0.0, SERVED, SGLANG)
    assert snap.values["running"] == _reference(text, "sglang:num_running_reqs") == 4.0  # 2 on each dp rank
    assert snap.values["waiting"] == _reference(text, "sglang:num_queue_reqs") == 2.0
    decode = _reference(text, "sglang:realtime_tokens_total", mode="decode")
    assert snap.values["generation_tokens"] == decode > 0  # both data-parallel ranks' decode tokens
    assert snap.values["requests"] == _reference(text, "sglang:num_requests_total") == 9.0  # streamed or not
    assert snap.values["errors"] == _reference(text, "sglang:num_aborted_requests_total") == 1.0
    assert "server_errors" not in snap.values or snap.values["server_errors"] == 0.0  # no 5xx was answered
    assert snap.values["prefix_hits"] == _reference(text, "sglang:cached_tokens_total") > 0
    ttft = snap.histograms["ttft"]
    assert min(ttft) == 0.1 and ttft[math.inf] == _reference(text, "sglang:time_to_first_token_seconds_count")
    assert snap.histograms["itl"][math.inf] == _reference(text, "sglang:inter_token_latency_seconds_count") > 0
    assert "steps" not in snap.histograms  # SGLang has no step counter: no inter-token evidence
    # Two scrapes a window apart become rates and quantiles, as for vLLM.
    sample = engine_sample(snap, parse_metrics(text, -5.0, SERVED, SGLANG))
    assert sample.requests_running == 4.0 and sample.requests_per_second == 0.0


def _ranked(dp: int, tp: int, running: float) -> str:
    labels = f'dp_rank="{dp}",engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="{tp}"'
    return f"sglang:num_running_reqs{{{labels}}} {running}\n"


def test_sglang_ranks_combine_data_parallel_summed_and_tensor_parallel_counted_once() -> None:
    # Were every tensor rank to report (--enable-metrics-for-all-schedulers), each would show its batch again.
    text = "".join(_ranked(dp, tp, running=4.0 + dp) for dp in (0, 1) for tp in (0, 1))
    assert parse_metrics(text, 0.0, "qwen", SGLANG).values["running"] == 4.0 + 5.0
    assert parse_metrics(text, 0.0, "other-model", SGLANG).values["running"] == 0  # another model's series


def test_a_failed_sglang_request_is_its_5xx_on_a_generation_endpoint() -> None:
    def scrape(failed: float, health_503: float, at: float) -> EngineSample:
        text = (f'sglang:num_requests_total{{engine_type="unified",is_streaming="true",model_name="qwen"}} 10\n'
                f'sglang:num_aborted_requests_total{{engine_type="unified",model_name="qwen"}} 1\n'
                f'sglang:http_responses_total{{endpoint="/v1/chat/completions",method="POST",status_code="500"}} '
                f'{failed}\n'
                f'sglang:http_responses_total{{endpoint="/health",method="GET",status_code="503"}} {health_503}\n')
        return parse_metrics(text, at, "qwen", SGLANG)
    sample = engine_sample(scrape(3.0, 9.0, 10.0), scrape(1.0, 2.0, 0.0))
    assert sample.errors_per_second == 0.2  # two 500s in 10 s; the health probe's 503s are no user's errors


def test_one_engine_series_are_not_read_as_the_others() -> None:
    text = SGLANG_FIXTURE.read_text()
    with pytest.raises(ValueError, match="none of the vllm: series"):
        parse_metrics(text, 0.0, None, VLLM)


SGLANG_ARGS = ["--model-path", "/models/qwen", "--max-running-requests"]


def _sglang(name: str, value: int, history, gpus=(0,)):
    return replica(name=name, args=[*SGLANG_ARGS, str(value)], history=history, engine_kind="sglang",
                   gpus=list(gpus))


def test_the_governor_lowers_sglangs_max_running_requests_on_a_canary() -> None:
    reps = [_sglang("s1", 256, fine(256, 0, 300) + breaching(256, 310, 120)),
            _sglang("s2", 256, fine(256, 0, 300) + breaching(256, 310, 120, itl=0.45))]
    snap = fleet(430, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "lower_max_num_seqs" and act.target.key == "replica:n1/s2"
    assert act.params["flag"] == "--max-running-requests" and act.params["max_num_seqs"] == 192
    assert act.params["engine_args"]["n1/s2"] == [*SGLANG_ARGS, "192"]


def test_at_the_floor_an_sglang_replica_skips_rungs_only_vllm_knows() -> None:
    snap = fleet(300, [_sglang("s1", 16, breaching(16, 0, 300))])
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "alert" and "--block-size 32 is no SGLang flag" in act.reason
    # The rung both engines know is taken, as for vLLM, on an engine over two GPUs.
    snap = fleet(300, [_sglang("s1", 16, breaching(16, 0, 300), gpus=(0, 1))])
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "add_engine_flag" and act.params["flag"] == "--disable-custom-all-reduce"
    assert act.params["engine_args"]["n1/s1"] == [*SGLANG_ARGS, "16", "--disable-custom-all-reduce"]
