"""vLLM (0.33; older metric names where vLLM renamed them, read when the current one is absent).

==================  =========  ==================================================================
key                 kind       sample names (current first, then old)
==================  =========  ==================================================================
running             gauge      vllm:num_requests_running
waiting             gauge      vllm:num_requests_waiting
kv_usage            gauge-max  vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc
preemptions         counter    vllm:num_preemptions_total
prompt_tokens       counter    vllm:prompt_tokens_total
generation_tokens   counter    vllm:generation_tokens_total
requests            counter    vllm:request_success_total (all finished_reason)
errors              counter    vllm:request_success_total{finished_reason=error|abort}
prefix_queries      counter    vllm:prefix_cache_queries_total, vllm:gpu_prefix_cache_queries_total
prefix_hits         counter    vllm:prefix_cache_hits_total, vllm:gpu_prefix_cache_hits_total
ttft                histogram  vllm:time_to_first_token_seconds
itl                 histogram  vllm:inter_token_latency_seconds, vllm:time_per_output_token_seconds
e2e                 histogram  vllm:e2e_request_latency_seconds
steps               histogram  vllm:iteration_tokens_total (its count: one per engine step)
==================  =========  ==================================================================

A data-parallel vLLM labels each engine's series ``engine``: they are summed. ``/health`` answers 200 before the
model is served and on a wedged EngineCore (vLLM #39863), so readiness also needs ``/v1/models`` to list it.
"""

from __future__ import annotations

from engines.types import EngineAdapter, EngineMetric, Probes, Rungs, Shutdown

VLLM = EngineAdapter(
    name="vllm",
    title="vLLM",
    metric_prefix="vllm:",
    metrics=(
        EngineMetric("running", "gauge", ("vllm:num_requests_running",)),
        EngineMetric("waiting", "gauge", ("vllm:num_requests_waiting",)),
        EngineMetric("kv_usage", "gauge-max", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
        EngineMetric("preemptions", "counter", ("vllm:num_preemptions_total",)),
        EngineMetric("prompt_tokens", "counter", ("vllm:prompt_tokens_total",)),
        EngineMetric("generation_tokens", "counter", ("vllm:generation_tokens_total",)),
        EngineMetric("requests", "counter", ("vllm:request_success_total",)),
        EngineMetric("errors", "counter", ("vllm:request_success_total",),
                     label=("finished_reason", frozenset({"error", "abort"}))),
        EngineMetric("prefix_queries", "counter",
                     ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")),
        EngineMetric("prefix_hits", "counter",
                     ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
        EngineMetric("ttft", "histogram", ("vllm:time_to_first_token_seconds",)),
        EngineMetric("itl", "histogram",
                     ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
        EngineMetric("e2e", "histogram", ("vllm:e2e_request_latency_seconds",)),
        EngineMetric("steps", "histogram", ("vllm:iteration_tokens_total",)),
    ),
    probes=Probes(),
    served_name_flag="--served-model-name",
    command=("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}"),
    sim_flags=(),
    # uvicorn's timeout_keep_alive in vLLM's API server (5 s when unset).
    keep_alive_var="VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
    shutdown=Shutdown(timeout_flag="--shutdown-timeout"),
    governed_flag="--max-num-seqs",
    governed_default=256,
    rungs=Rungs(
        switches=frozenset({"--disable-custom-all-reduce", "--enforce-eager", "--disable-cascade-attn"}),
        valued=frozenset({"--block-size", "--max-num-batched-tokens", "--gpu-memory-utilization",
                          "--kv-cache-dtype"}),
        multi_gpu_only=frozenset({"--disable-custom-all-reduce"}),
        tensor_parallel=("--tensor-parallel-size", "-tp"),
        pipeline_parallel=("--pipeline-parallel-size", "-pp"),
    ),
    core_process="VLLM::EngineCore",
    ttft_buckets_flag=None,
    lowest_ttft_bucket=0.001,
    live_cap=True,
)
