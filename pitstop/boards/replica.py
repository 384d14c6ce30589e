"""The replica board: what is wrong with this one replica?"""

from __future__ import annotations

from pitstop.boards import engines
from pitstop.boards.common import ACTIONS, FLEET, GPU, board_links, firing_alerts
from pitstop.boards.engines import RUNNING_CAPS
from pitstop.boards.grafana import Dashboard, Panel, Row, Step, Target, Variable, steps
from pitstop.boards.inputs import Inputs, Slo
from pitstop.boards.promql import Scope

S = Scope(("node", "engine", "model", "replica"))
QUANTILES = ("0.5", "0.95", "0.99")
RSS_LEAK = 256 * 1024 * 1024  # HostRSSLeak: bytes per hour, for 30 minutes
GPU_MEMORY_LEAK = 512 * 1024 * 1024  # ReplicaGPUMemoryGrowing: bytes per hour, for 30 minutes
KV_WARN, KV_FULL = 0.9, 0.95

VARIABLES = (
    Variable("node", "Node", "label_values(pitstop_replica_ready, node)"),
    Variable("engine", "Engine", 'label_values(pitstop_replica_ready{node=~"$node"}, engine)'),
    Variable("model", "Model", 'label_values(pitstop_replica_ready{node=~"$node", engine=~"$engine"}, model)'),
    Variable("replica", "Replica",
             'label_values(pitstop_replica_ready{node=~"$node", engine=~"$engine", model=~"$model"}, replica)',
             multi=False),
)


def _flag(zero: str, one: str, bad: int) -> tuple[dict[str, object], ...]:
    colors = {bad: "red", 1 - bad: "green"}
    return ({"type": "value", "options": {
        "0": {"text": zero, "color": colors[0], "index": 0},
        "1": {"text": one, "color": colors[1], "index": 1},
    }},)


def _quantiles(key: str) -> tuple[Target, ...]:
    """p50, p95 and p99 of the engines' histogram ``key``: by engine, so two engines' bounds never add up."""
    buckets = engines.rate(S, key, suffix="_bucket")
    return tuple(Target(f"histogram_quantile({q}, sum by (le, engine) ({buckets}))",
                        f"p{round(float(q) * 100)} {{{{engine}}}}") for q in QUANTILES)


def _slo(slo: Slo) -> tuple[Step, ...]:
    return steps("green", ("red", slo.threshold))


def _rate(*keys: str) -> str:
    """The rate of the engines' figures ``keys`` over the selected replicas."""
    return f"sum({engines.rate(S, *keys)})"


def _state_row(inputs: Inputs) -> Row:
    return Row("State", (
        Panel(title="State", kind="state-timeline", unit="short", width=16, height=6,
              alerts=("ReplicaDown", "ReplicaCrashLoop"),
              description="The supervisor's state over time, one lane per state the replica passed through. "
              "READY serves; STARTING/WARMING long means a slow or failing start (engine log), BACKOFF and "
              "FATAL a crash loop, WEDGED an engine Pitstop found stalled.",
              targets=(Target(f"max by (node, replica, state) ({S.sel('pitstop_replica_state')}) == 1",
                              "{{node}}/{{replica}} {{state}}"),)),
        Panel(title="Failure restarts in range", kind="stat", unit="short", width=8, height=6,
              alerts=("ReplicaRestarting", "ReplicaCrashLoop"), thresholds=steps("green", ("orange", 1), ("red", 3)),
              description="Restarts after failures over the time range. Three within 15 minutes raise "
              "ReplicaRestarting; the agent gives up (FATAL) after its max failures: read the engine's last "
              "log lines before restarting it by hand.",
              targets=(Target(f"sum(increase({S.sel('pitstop_replica_restarts_total')}[$__range]))", "restarts"),)),
        Panel(title="Canary TTFT", unit="s", width=8, alerts=("CanaryFailing",),
              thresholds=_slo(inputs.targets.ttft), threshold_style="dashed",
              description=f"Time to first token of the agent's last canary request (one short streaming "
              f"request), against the TTFT objective {inputs.targets.ttft.threshold:g} s. A canary slower than "
              "real traffic's p99 points at the engine, not the load.",
              targets=(Target(S.sel("pitstop_canary_ttft_seconds"), "canary TTFT"),)),
        Panel(title="Canary OK", kind="state-timeline", unit="short", width=8, alerts=("CanaryFailing",),
              mappings=_flag("failing", "ok", bad=0), thresholds=steps("red", ("green", 1)),
              description="Whether the last canary request completed within its deadline (pitstop_canary_ok). "
              "Failing for 2 minutes raises CanaryFailing; failing with no tokens generated is a stall.",
              targets=(Target(S.sel("pitstop_canary_ok"), "canary"),)),
        Panel(title="Stalled", kind="state-timeline", unit="short", width=8, alerts=("EngineStalled",),
              mappings=_flag("progressing", "stalled", bad=1), thresholds=steps("green", ("red", 1)),
              description="1 while work is queued and no token moves (a wedged EngineCore still answers /health "
              "200). The stall policy restarts it (drained) once its canary fails too; stalled for minutes "
              "without a restart: follow the runbook.",
              targets=(Target(S.sel("pitstop_engine_stalled"), "stalled"),)),
        Panel(title="Engine /metrics scrape errors", unit="short", width=12, alerts=("EngineScrapeErrors",),
              thresholds=steps("green", ("red", 1)), custom={"drawStyle": "bars", "fillOpacity": 60},
              description="Failed scrapes of the engine's /metrics by the agent. While they fail, stall, SLO and "
              "error detection are blind for this replica: check that the engine answers on its port.",
              targets=(Target(f"sum(increase({S.sel('pitstop_engine_scrape_errors_total')}[$__rate_interval]))",
                              "scrape errors"),)),
        firing_alerts(S, inputs.alerts, title="Firing alerts for this replica, its node and its model",
                      width=12,
                      description="Pitstop's alerts firing now about the selected replica, and those about its "
                      "node or its model as a whole (they carry no replica label)."),
    ))


def _latency_row(inputs: Inputs) -> Row:
    t = inputs.targets
    how = ("histogram_quantile over the rate of the engine's own histogram buckets of the selected replicas "
           "(summed when several are selected, each engine apart)")
    return Row("Latency (the engine's histograms)", (
        Panel(title="TTFT p50 / p95 / p99", unit="s", width=8, alerts=("TTFTSLOBreach",), thresholds=_slo(t.ttft),
              threshold_style="dashed",
              description=f"Time to first token, {how}; the line is the objective {t.ttft.threshold:g} s. High "
              "with a queue: the replica is overloaded (see Load); high without one: prefill is slow.",
              targets=_quantiles("ttft")),
        Panel(title="Inter-token latency p50 / p95 / p99", unit="s", width=8, alerts=("ITLSLOBreach",),
              thresholds=_slo(t.itl), threshold_style="dashed",
              description=f"Inter-token latency, {how}; the line is the objective {t.itl.threshold:g} s. High: "
              "the batch is too large or sequences are preempted; the itl-slo governor lowers the running-request "
              f"cap ({RUNNING_CAPS}).",
              targets=_quantiles("itl")),
        Panel(title="End-to-end latency p50 / p95 / p99", unit="s", width=8,
              description=f"Request latency from arrival to the last token, {how}. It follows the output length; "
              "a rise without longer outputs is queueing (see Requests running and waiting) or slower decoding.",
              targets=_quantiles("e2e")),
    ))


def _load_row(inputs: Inputs) -> Row:
    t = inputs.targets
    finished = _rate("requests")
    # What the agent counts as errors: the adapter's errors, and server errors where the engine counts them apart
    # (SGLang's HTTP 5xx). An engine counts its first error with the series (SGLang's): none yet is 0.
    failed = f"({_rate('errors', 'server_errors')} or vector(0))"
    kv = S.sel("pitstop_engine_kv_cache_usage_ratio")
    return Row("Load", (
        Panel(title="Requests running and waiting", unit="short", width=8,
              description="Requests in the running batch and waiting, as the agent reads them from the engine "
              "(pitstop_engine_requests_running/waiting). A queue that keeps growing: the replica is past its "
              "capacity.",
              targets=(Target(f"sum({S.sel('pitstop_engine_requests_running')})", "running"),
                       Target(f"sum({S.sel('pitstop_engine_requests_waiting')})", "waiting"))),
        Panel(title="Tokens/s", unit="short", width=8,
              description="Prompt (prefill) and generated tokens per second. Generation at 0 with requests "
              "running is a stall.",
              targets=(Target(_rate("generation_tokens"), "generation"),
                       Target(_rate("prompt_tokens"), "prompt"))),
        Panel(title="Finished and failed requests/s", unit="reqps", width=8,
              description=f"Requests finished per second ({engines.names('requests')}), and those that failed "
              f"({engines.names('errors', 'server_errors')}). Rising failures: see the error ratio and the "
              "engine log.",
              targets=(Target(finished, "finished"), Target(failed, "error or abort"))),
        Panel(title="Error ratio", unit="percentunit", width=12, alerts=("HighErrorRate",),
              thresholds=steps("green", ("red", t.errors.threshold)), threshold_style="dashed",
              description=f"Errors and aborts over finished requests; the line is the objective "
              f"{t.errors.threshold:g} (policy {t.errors.policy}). This replica alone above it: its engine "
              "fails requests (restart it); all replicas of the model: the requests or the model.",
              targets=(Target(f"{failed} / {finished}", "error ratio"),)),
        Panel(title="KV cache usage and preemptions", unit="percentunit", width=12, min=0,
              alerts=("KVCacheSaturated",), thresholds=steps("green", ("orange", KV_WARN), ("red", KV_FULL)),
              threshold_style="dashed",
              overrides=(
                  {"matcher": {"id": "byName", "options": "KV cache"}, "properties": [{"id": "max", "value": 1}]},
                  {"matcher": {"id": "byName", "options": "preemptions/s"}, "properties": [
                      {"id": "unit", "value": "short"}, {"id": "custom.axisPlacement", "value": "right"},
                      {"id": "custom.thresholdsStyle", "value": {"mode": "off"}}]},
              ),
              description="KV cache usage (left, pitstop_engine_kv_cache_usage_ratio) and sequences preempted "
              f"per second (right, {engines.names('preemptions')}): a full cache makes the engine evict running "
              "sequences and recompute them; the itl-slo governor lowers the running-request cap "
              f"({RUNNING_CAPS}) on sustained preemptions.",
              targets=(Target(f"max({kv})", "KV cache"),
                       # SGLang's counter appears with its first retraction: none yet is 0.
                       Target(f"{_rate('preemptions')} or vector(0)", "preemptions/s"))),
    ))


def _memory_row() -> Row:
    rss, gpu = S.sel("pitstop_replica_rss_bytes"), S.sel("pitstop_replica_gpu_memory_bytes")
    return Row("Memory (leaks)", (
        Panel(title="Host RSS of the engine process tree", unit="bytes", alerts=("HostRSSLeak",),
              overrides=({"matcher": {"id": "byName", "options": "in 24 h at the last hour's slope"},
                          "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]},),
              description="Host memory of the engine and all its children. EngineCore/worker leaks are slow "
              "(vLLM #44175, #43639); the dashed projection shows where the last hour's slope leads in 24 h: "
              "past the host's memory, plan a restart before the OOM killer does it.",
              targets=(Target(rss, "RSS"),
                       Target(f"predict_linear({rss}[1h], 86400)", "in 24 h at the last hour's slope"))),
        Panel(title="RSS growth per hour", unit="bytes", alerts=("HostRSSLeak",),
              thresholds=steps("green", ("red", RSS_LEAK)),
              description="Host RSS growth per hour over the last hour. HostRSSLeak fires above 256 MiB/h for 30 "
              "minutes; the rss-leak policy plans a restart when the host would be 95 % full within 24 h.",
              targets=(Target(f"deriv({rss}[1h]) * 3600", "growth/h"),)),
        Panel(title="GPU memory of the engine processes", unit="bytes", width=8,
              alerts=("ReplicaGPUMemoryGrowing",),
              description="GPU memory held by the engine's processes. Flat after start-up (the KV cache is "
              "preallocated); growth is a leak (vLLM #17243).",
              targets=(Target(gpu, "GPU memory"),)),
        Panel(title="GPU memory growth per hour", unit="bytes", width=8, alerts=("ReplicaGPUMemoryGrowing",),
              thresholds=steps("green", ("red", GPU_MEMORY_LEAK)),
              description="GPU memory growth per hour over the last hour. ReplicaGPUMemoryGrowing fires above "
              "512 MiB/h for 30 minutes; the gpu-memory-leak policy plans a restart when the GPU would be 95 % full "
              "within 24 h.",
              targets=(Target(f"deriv({gpu}[1h]) * 3600", "growth/h"),)),
        Panel(title="Processes in the engine tree", unit="short", width=8,
              description="Processes in the engine's tree (API server, EngineCore, workers). A count that "
              "keeps rising is leaked children; a drop while READY is a dead worker.",
              targets=(Target(S.sel("pitstop_replica_processes"), "processes"),)),
    ))


def board(inputs: Inputs) -> Dashboard:
    return Dashboard(
        uid="pitstop-replica", title="Pitstop replica",
        description="What is wrong with this replica? Its state, canary and stalls, latency from the engine's "
        "histograms, load, KV cache, errors, and host and GPU memory trends.",
        tags=("pitstop", "replica"), variables=VARIABLES,
        rows=(_state_row(inputs), _latency_row(inputs), _load_row(inputs), _memory_row()),
        links=board_links((FLEET, "Fleet"), (GPU, "GPUs of this node")),
        annotations=(ACTIONS,),
    )
