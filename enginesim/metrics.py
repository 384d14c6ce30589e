"""The vLLM 0.33 metric families the simulator exports, declared once, on a per-server registry.

``METRICS`` is the single table of names, kinds, extra labels and buckets; it matches
``enginesim/data/vllm-metrics.tsv`` (vLLM's own list) and vLLM's bucket choices, so a scrape of the simulator
reads like a scrape of vLLM: counters carry ``_total`` and ``_created``, every series carries ``model_name``
and ``engine``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from enginesim.engine import RequestHandle
    from enginesim.scheduler import Sequence, StepPlan

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
# Preemptions per finished request, as a real vLLM server exposes them (tests/fixtures/vllm-0.32.0-cpu).
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value``, as vLLM sizes its token-count histograms."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # gauge | counter | histogram
    doc: str
    extra_label: str | None = None
    buckets: str | None = None  # key into the bucket lists, resolved per server ("tokens" needs max_model_len)


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    MetricSpec("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    MetricSpec("vllm:num_requests_waiting_by_reason", "gauge", "Number of requests waiting, by reason.",
               "reason"),
    MetricSpec("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    MetricSpec("vllm:prefix_cache_queries", "counter",
               "Prefix cache queries, in terms of number of queried tokens."),
    MetricSpec("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    MetricSpec("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
    MetricSpec("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    MetricSpec("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
    MetricSpec("vllm:request_success", "counter", "Count of successfully processed requests.",
               "finished_reason"),
    MetricSpec("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.", None, "tokens"),
    MetricSpec("vllm:request_generation_tokens", "histogram", "Number of generation tokens processed.", None,
               "tokens"),
    MetricSpec("vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.",
               None, "iteration"),
    MetricSpec("vllm:request_max_num_generation_tokens", "histogram",
               "Histogram of maximum number of requested generation tokens.", None, "tokens"),
    MetricSpec("vllm:request_params_n", "histogram", "Histogram of the n request parameter.", None, "n"),
    MetricSpec("vllm:request_params_max_tokens", "histogram", "Histogram of the max_tokens request parameter.",
               None, "tokens"),
    MetricSpec("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
               None, "ttft"),
    MetricSpec("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
               None, "itl"),
    MetricSpec("vllm:request_time_per_output_token_seconds", "histogram",
               "Histogram of time_per_output_token_seconds per request.", None, "itl"),
    MetricSpec("vllm:e2e_request_latency_seconds", "histogram",
               "Histogram of e2e request latency in seconds.", None, "request"),
    MetricSpec("vllm:request_queue_time_seconds", "histogram",
               "Histogram of time spent in WAITING phase for request.", None, "request"),
    MetricSpec("vllm:request_inference_time_seconds", "histogram",
               "Histogram of time spent in RUNNING phase for request.", None, "request"),
    MetricSpec("vllm:request_prefill_time_seconds", "histogram",
               "Histogram of time spent in PREFILL phase for request.", None, "request"),
    MetricSpec("vllm:request_decode_time_seconds", "histogram",
               "Histogram of time spent in DECODE phase for request.", None, "request"),
    MetricSpec("vllm:request_num_preemptions", "histogram",
               "Histogram of the number of times a request was preempted.", None, "preemptions"),
)

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
BASE_LABELS = ("model_name", "engine")


def _buckets(key: str, max_model_len: int) -> tuple[float, ...]:
    return {
        "tokens": build_1_2_5_buckets(max_model_len),
        "iteration": ITERATION_TOKEN_BUCKETS,
        "n": PARAMS_N_BUCKETS,
        "ttft": TTFT_BUCKETS,
        "itl": ITL_BUCKETS,
        "request": REQUEST_TIME_BUCKETS,
        "preemptions": PREEMPTION_BUCKETS,
    }[key]


class EngineMetrics:
    """Every family of ``METRICS`` bound to one model name and engine index, plus ``cache_config_info``."""

    def __init__(self, registry: CollectorRegistry, *, model_name: str, max_model_len: int,
                 cache_info: dict[str, str], engine: str = "0") -> None:
        self.registry = registry
        # Set when the EngineCore hangs (``freeze``): every family here is fed by the core's stats, so from then
        # on nothing may move them (vllm#39863); the engine and the API check it before publishing.
        self.frozen = False
        values = (model_name, engine)
        self._families: dict[str, Gauge | Counter | Histogram] = {}
        for spec in METRICS:
            labels = [*BASE_LABELS, *([spec.extra_label] if spec.extra_label else [])]
            if spec.kind == "gauge":
                fam: Gauge | Counter | Histogram = Gauge(spec.name, spec.doc, labels, registry=registry)
            elif spec.kind == "counter":
                fam = Counter(spec.name, spec.doc, labels, registry=registry)
            else:
                assert spec.buckets is not None
                fam = Histogram(spec.name, spec.doc, labels, registry=registry,
                                buckets=_buckets(spec.buckets, max_model_len))
            self._families[spec.name] = fam
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     [*sorted(cache_info), "engine"], registry=registry)
        info.labels(*[cache_info[k] for k in sorted(cache_info)], engine).set(1)
        # Bind label values once; vLLM pre-creates every finished_reason child so all five read 0 at start.
        self.running = self._gauge("vllm:num_requests_running").labels(*values)
        self.waiting = self._gauge("vllm:num_requests_waiting").labels(*values)
        self.waiting_by_reason = {r: self._gauge("vllm:num_requests_waiting_by_reason").labels(*values, r)
                                  for r in WAITING_REASONS}
        self.kv_usage = self._gauge("vllm:kv_cache_usage_perc").labels(*values)
        self.prefix_queries = self._counter("vllm:prefix_cache_queries").labels(*values)
        self.prefix_hits = self._counter("vllm:prefix_cache_hits").labels(*values)
        self.preemptions = self._counter("vllm:num_preemptions").labels(*values)
        self.prompt_tokens = self._counter("vllm:prompt_tokens").labels(*values)
        self.generation_tokens = self._counter("vllm:generation_tokens").labels(*values)
        self.success = {r: self._counter("vllm:request_success").labels(*values, r) for r in FINISHED_REASONS}
        h = self._histogram
        self.request_prompt_tokens = h("vllm:request_prompt_tokens").labels(*values)
        self.request_generation_tokens = h("vllm:request_generation_tokens").labels(*values)
        self.iteration_tokens = h("vllm:iteration_tokens_total").labels(*values)
        self.request_max_tokens = h("vllm:request_max_num_generation_tokens").labels(*values)
        self.params_n = h("vllm:request_params_n").labels(*values)
        self.params_max_tokens = h("vllm:request_params_max_tokens").labels(*values)
        self.ttft = h("vllm:time_to_first_token_seconds").labels(*values)
        self.itl = h("vllm:inter_token_latency_seconds").labels(*values)
        self.tpot = h("vllm:request_time_per_output_token_seconds").labels(*values)
        self.e2e = h("vllm:e2e_request_latency_seconds").labels(*values)
        self.queue_time = h("vllm:request_queue_time_seconds").labels(*values)
        self.inference_time = h("vllm:request_inference_time_seconds").labels(*values)
        self.prefill_time = h("vllm:request_prefill_time_seconds").labels(*values)
        self.decode_time = h("vllm:request_decode_time_seconds").labels(*values)
        self.request_preemptions = h("vllm:request_num_preemptions").labels(*values)

    def _gauge(self, name: str) -> Gauge:
        fam = self._families[name]
        assert isinstance(fam, Gauge)
        return fam

    def _counter(self, name: str) -> Counter:
        fam = self._families[name]
        assert isinstance(fam, Counter)
        return fam

    def _histogram(self, name: str) -> Histogram:
        fam = self._families[name]
        assert isinstance(fam, Histogram)
        return fam

    # The engine's events (``sink.MetricsSink``), as vLLM counts them.

    def request_submitted(self, handle: RequestHandle) -> None:
        self.params_n.observe(1)
        self.params_max_tokens.observe(handle.max_tokens)
        self.request_max_tokens.observe(handle.max_tokens)

    def prefix_queried(self, prompt_tokens: int) -> None:
        self.prefix_queries.inc(prompt_tokens)

    def prefix_hit(self, cached_tokens: int) -> None:
        self.prefix_hits.inc(cached_tokens)

    def step_scheduled(self, plan: StepPlan) -> None:
        if plan.preempted:
            self.preemptions.inc(len(plan.preempted))
        if plan.scheduled:
            self.iteration_tokens.observe(plan.num_tokens)

    def step_ran(self, plan: StepPlan, seconds: float) -> None:
        pass  # vLLM exports no device-time counter

    def prefill_done(self, seq: Sequence) -> None:
        self.prompt_tokens.inc(seq.prompt_tokens)

    def token_emitted(self, handle: RequestHandle, gap: float | None) -> None:
        self.generation_tokens.inc()
        if gap is not None:
            self.itl.observe(gap)

    def first_token_sent(self, handle: RequestHandle, ttft: float) -> None:
        self.ttft.observe(ttft)

    def request_finished(self, handle: RequestHandle, reason: str, now: float) -> None:
        self.success[reason].inc()
        self.e2e.observe(now - handle.arrival)
        if handle.first_scheduled is not None:
            self.queue_time.observe(handle.first_scheduled - handle.arrival)
            self.inference_time.observe(now - handle.first_scheduled)
        if handle.first_token is not None and handle.first_scheduled is not None:
            self.prefill_time.observe(handle.first_token - handle.first_scheduled)
            self.decode_time.observe(now - handle.first_token)
        if handle.seq.generated > 1 and handle.first_token is not None:
            self.tpot.observe((now - handle.first_token) / (handle.seq.generated - 1))
        self.request_prompt_tokens.observe(handle.seq.prompt_tokens)
        self.request_generation_tokens.observe(handle.seq.generated)
        self.request_preemptions.observe(handle.seq.num_preemptions)

    def request_failed(self, handle: RequestHandle, reason: str) -> None:
        self.success[reason].inc()

    def request_aborted(self, handle: RequestHandle) -> None:
        pass  # counted when the engine finishes it as ``abort``; a frozen core never reports it

    def error_answered(self) -> None:
        if not self.frozen:  # a hung engine's counters stay flat (vllm#39863)
            self.success["error"].inc()

    def freeze(self, *, zero_scheduler_gauges: bool) -> None:
        """Stop publishing for good, first zeroing the running and waiting gauges if asked (KV usage stays)."""
        if zero_scheduler_gauges and not self.frozen:
            self.running.set(0)
            self.waiting.set(0)
            for gauge in self.waiting_by_reason.values():
                gauge.set(0)
        self.frozen = True

    def set_scheduler_state(self, *, running: int, waiting: int, waiting_for_capacity: int,
                            kv_usage: float, step: StepPlan | None = None) -> None:
        """Gauges as vLLM sets them after every step; nothing once frozen."""
        if self.frozen:
            return
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_by_reason["capacity"].set(waiting_for_capacity)
        self.waiting_by_reason["deferred"].set(waiting - waiting_for_capacity)
        self.kv_usage.set(kv_usage)
