"""SGLang, as users run it: ``python -m sglang.launch_server`` with ``--enable-metrics`` (no /metrics without it).

Read from SGLang 0.5.23's own metric code (``tests/fixtures/sglang-0.5.23/``: its collectors' output, captured).

==================  =========  ==================================================================
key                 kind       sample names
==================  =========  ==================================================================
running             gauge      sglang:num_running_reqs
waiting             gauge      sglang:num_queue_reqs
kv_usage            gauge-max  sglang:token_usage (the KV pool's share in use)
preemptions         counter    sglang:num_retracted_requests_total (requests retracted to free KV)
prompt_tokens       counter    sglang:prompt_tokens_total
generation_tokens   counter    sglang:realtime_tokens_total{mode=decode}
requests            counter    sglang:num_requests_total
errors              counter    sglang:num_aborted_requests_total
server_errors       counter    sglang:http_responses_total{status_code=5xx, endpoint=a generation endpoint}
prefix_queries      counter    sglang:prompt_tokens_total (the radix cache is asked for every prompt token)
prefix_hits         counter    sglang:cached_tokens_total
ttft                histogram  sglang:time_to_first_token_seconds
itl                 histogram  sglang:inter_token_latency_seconds
e2e                 histogram  sglang:e2e_request_latency_seconds
==================  =========  ==================================================================

Which series carry ranks: the scheduler's (running, waiting, KV usage, retractions, realtime tokens) carry
``tp_rank``, ``pp_rank`` and ``moe_ep_rank``, and ``dp_rank`` with ``--dp-size`` over 1. Each data-parallel rank
runs its own batch (summed); only tensor rank 0 reports, the others show zeros their collectors made (one counts:
rank 0's). The server's (tokens and requests at finish, latencies, aborts) carry no rank at all.

Generated tokens are read from ``sglang:realtime_tokens_total{mode="decode"}``, which the scheduler moves as it
decodes (at each log interval, 40 decode batches), not from ``sglang:generation_tokens_total``, which moves only
when a request finishes: a long generation would otherwise read as no token moving, and a busy engine as wedged.
A request that failed is an HTTP 5xx on a generation endpoint (``sglang:num_aborted_requests_total`` counts only
clients that left). SGLang has no step counter, so a canary's inter-token latency is judged at the end of its
window, not on evidence (docs/design.md, "Canary evidence").

``/health`` and ``/health_generate`` are one handler that waits for a one-token generation (at least a second):
503 while starting, from SIGTERM on and when nothing came; 200 while the scheduler is dead (sglang#6624) and 503
during a long prefill (sglang#22511). So the wedge verdict rests on canaries and token progress, as for vLLM, and
an attached SGLang is probed on ``/v1/models``. Its own watchdog (``--watchdog-timeout``, 300 s) kills the server
on a batch stuck that long. On SIGTERM it drains with no timeout of its own: the replica's ``stop_timeout``
bounds a stop. Its TTFT buckets start at 0.1 s and lack 0.5 s, the shipped TTFT objective: the default command
gives ``--bucket-time-to-first-token`` with 0.5 s added (a replica's own ``args`` giving it again win, as the
later flag does in SGLang's parser).
"""

from __future__ import annotations

from engines.types import EngineAdapter, EngineMetric, Probes, Rungs, Shutdown

# SGLang's default TTFT bucket bounds (0.1 s up) and the shipped TTFT objective's 0.5 s, which they lack: started
# with these, an SGLang engine's TTFT SLO can be measured (the miss ratio reads the bucket at the threshold).
TTFT_BUCKETS = ("0.1", "0.2", "0.4", "0.5", "0.6", "0.8", "1", "2", "4", "6", "8", "10", "20", "40", "60", "80", "100",
                "200", "400")

# The endpoints that generate: a 5xx there is a request that failed (a 503 of /health is a probe's answer).
GENERATION_ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions", "/generate"})

SGLANG = EngineAdapter(
    name="sglang",
    title="SGLang",
    metric_prefix="sglang:",
    metrics=(
        EngineMetric("running", "gauge", ("sglang:num_running_reqs",)),
        EngineMetric("waiting", "gauge", ("sglang:num_queue_reqs",)),
        EngineMetric("kv_usage", "gauge-max", ("sglang:token_usage",)),
        EngineMetric("preemptions", "counter", ("sglang:num_retracted_requests_total",)),
        EngineMetric("prompt_tokens", "counter", ("sglang:prompt_tokens_total",)),
        EngineMetric("generation_tokens", "counter", ("sglang:realtime_tokens_total",),
                     label=("mode", frozenset({"decode"}))),
        EngineMetric("requests", "counter", ("sglang:num_requests_total",)),
        EngineMetric("errors", "counter", ("sglang:num_aborted_requests_total",)),
        EngineMetric("server_errors", "counter", ("sglang:http_responses_total",),
                     label=("status_code", frozenset(str(code) for code in range(500, 600))),
                     where=(("endpoint", GENERATION_ENDPOINTS),)),
        EngineMetric("prefix_queries", "counter", ("sglang:prompt_tokens_total",)),
        EngineMetric("prefix_hits", "counter", ("sglang:cached_tokens_total",)),
        EngineMetric("ttft", "histogram", ("sglang:time_to_first_token_seconds",)),
        EngineMetric("itl", "histogram", ("sglang:inter_token_latency_seconds",)),
        EngineMetric("e2e", "histogram", ("sglang:e2e_request_latency_seconds",)),
    ),
    probes=Probes(health="/health", health_generates=True),
    served_name_flag="--served-model-name",
    command=("python3", "-m", "sglang.launch_server", "--model-path", "{model}", "--host", "{host}",
             "--port", "{port}", "--enable-metrics", "--bucket-time-to-first-token", *TTFT_BUCKETS),
    sim_flags=("--engine", "sglang", "--enable-metrics", "--bucket-time-to-first-token", *TTFT_BUCKETS),
    keep_alive_var=None,
    shutdown=Shutdown(timeout_flag=None),
    governed_flag="--max-running-requests",
    governed_default=None,
    rungs=Rungs(
        switches=frozenset({"--disable-custom-all-reduce", "--disable-cuda-graph", "--disable-radix-cache",
                            "--enable-mixed-chunk"}),
        valued=frozenset({"--chunked-prefill-size", "--mem-fraction-static", "--cuda-graph-max-bs",
                          "--schedule-conservativeness", "--kv-cache-dtype"}),
        multi_gpu_only=frozenset({"--disable-custom-all-reduce"}),
        tensor_parallel=("--tp-size", "--tp"),
        pipeline_parallel=("--pp-size", "--pp"),
    ),
    copy_labels=frozenset({"tp_rank", "pp_rank", "moe_ep_rank"}),
    core_process="sglang::scheduler",
    ttft_buckets_flag="--bucket-time-to-first-token",
    lowest_ttft_bucket=0.1,
    live_cap=False,
)
