"""SGLang 0.5.23's metric families, as its ``/metrics`` shows them, fed by the simulated engine.

``FAMILIES`` is the one table of what is exported: name, kind, scope, extra labels, buckets. The scope decides
the base labels, as in SGLang: ``server`` families come from its tokenizer manager (``model_name``,
``engine_type``), ``rank`` families from each scheduler (those two plus ``tp_rank``, ``pp_rank``, ``moe_ep_rank``
and, with ``--dp-size`` > 1, ``dp_rank``), ``http`` families from its HTTP middleware (no base labels).
The families SGLang exports and the simulator does not are listed, with the reason, in
``tests/sim/test_sglang_metrics.py``.

SGLang serves its metrics through prometheus_client's multiprocess collector; ``enginesim.exposition`` renders
a registry the same way.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from enginesim.clock import Clock
from enginesim.scheduler import Scheduler
from enginesim.sglang import DECODE_LOG_INTERVAL, ENGINE_TYPE, QUEUE_TIME_BUCKETS, TOKEN_BUCKETS, SglangOptions

if TYPE_CHECKING:
    from enginesim.engine import RequestHandle
    from enginesim.scheduler import Sequence, StepPlan

CACHE_HIT_WINDOW_S = 15.0  # SGLang's cache hit rate covers the prefills of the last 15 s
SERVER_LABELS = ("model_name", "engine_type")
RANK_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
PREFILL_MODES = ("input", "device_hit", "host_hit", "storage_hit")  # pre-created by every scheduler


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # gauge | counter | histogram
    scope: str  # server | rank | http
    doc: str
    extra: tuple[str, ...] = ()
    buckets: str | None = None  # ttft | itl | e2e | tokens | queue


FAMILIES: tuple[Family, ...] = (
    Family("sglang:prompt_tokens_total", "counter", "server", "Prompt tokens of finished requests.", ("is_streaming",)),
    Family("sglang:generation_tokens_total", "counter", "server", "Tokens generated for finished requests.",
           ("is_streaming",)),
    Family("sglang:num_requests_total", "counter", "server", "Finished requests.", ("is_streaming",)),
    Family("sglang:cached_tokens_total", "counter", "server", "Prompt tokens served from the cache, by where.",
           ("cache_source",)),
    Family("sglang:num_aborted_requests_total", "counter", "server", "Requests aborted (client gone)."),
    Family("sglang:time_to_first_token_seconds", "histogram", "server", "Time to first token.", ("is_streaming",),
           "ttft"),
    Family("sglang:inter_token_latency_seconds", "histogram", "server", "Time between output tokens.", (), "itl"),
    Family("sglang:request_time_per_output_token_seconds", "histogram", "server",
           "Decode time per output token of each finished request.", ("is_streaming",), "itl"),
    Family("sglang:e2e_request_latency_seconds", "histogram", "server", "Arrival to last token.", ("is_streaming",),
           "e2e"),
    Family("sglang:prompt_tokens_histogram", "histogram", "server", "Prompt length.", (), "tokens"),
    Family("sglang:uncached_prompt_tokens_histogram", "histogram", "server", "Prompt tokens computed.", (), "tokens"),
    Family("sglang:generation_tokens_histogram", "histogram", "server", "Output length.", (), "tokens"),
    Family("sglang:http_requests_total", "counter", "http", "HTTP requests.", ("endpoint", "method")),
    Family("sglang:http_responses_total", "counter", "http", "HTTP responses.", ("endpoint", "status_code", "method")),
    Family("sglang:http_requests_active", "gauge", "http", "HTTP requests in progress.", ("endpoint", "method")),
    Family("sglang:num_running_reqs", "gauge", "rank", "Requests in the running batch."),
    Family("sglang:num_queue_reqs", "gauge", "rank", "Requests waiting to be scheduled."),
    Family("sglang:token_usage", "gauge", "rank", "Share of the KV pool in use (the fullest pool)."),
    Family("sglang:full_token_usage", "gauge", "rank", "Share of the full-attention KV pool in use."),
    Family("sglang:num_used_tokens", "gauge", "rank", "KV tokens in use."),
    Family("sglang:kv_used_tokens", "gauge", "rank", "KV tokens held by running requests."),
    Family("sglang:kv_available_tokens", "gauge", "rank", "Free KV tokens."),
    Family("sglang:kv_evictable_tokens", "gauge", "rank", "KV tokens held only by the prefix cache."),
    Family("sglang:gen_throughput", "gauge", "rank", "Decode tokens per second since the last report."),
    Family("sglang:cache_hit_rate", "gauge", "rank", "Share of recent prompt tokens found in the cache."),
    Family("sglang:decode_sum_seq_lens", "gauge", "rank", "Tokens of all running sequences."),
    Family("sglang:max_total_num_tokens", "gauge", "rank", "KV pool size in tokens."),
    Family("sglang:page_size", "gauge", "rank", "Tokens per KV page."),
    Family("sglang:num_pages", "gauge", "rank", "KV pages."),
    Family("sglang:context_len", "gauge", "rank", "Longest sequence served."),
    Family("sglang:num_retracted_requests_total", "counter", "rank", "Requests retracted to free KV."),
    Family("sglang:num_retracted_input_tokens_total", "counter", "rank", "Prompt tokens of retracted requests."),
    Family("sglang:num_retracted_output_tokens_total", "counter", "rank", "Output tokens of retracted requests."),
    Family("sglang:realtime_tokens_total", "counter", "rank", "Tokens processed, by kind.", ("mode",)),
    Family("sglang:prefill_effective_tokens_total", "counter", "rank", "Prefill tokens, by where they came from.",
           ("mode",)),
    Family("sglang:forward_execution_seconds_total", "counter", "rank", "Device time of forward passes.",
           ("category",)),
    Family("sglang:queue_time_seconds", "histogram", "rank", "Wait before the first forward pass.", (), "queue"),
)


def _base_labels(scope: str, dp_size: int) -> tuple[str, ...]:
    """A scope's base label names; ``dp_rank`` only on a server with a data-parallel controller."""
    ranks = (*RANK_LABELS, "dp_rank") if dp_size > 1 else RANK_LABELS
    return {"server": SERVER_LABELS, "rank": ranks, "http": ()}[scope]


class SglangMetrics:
    """Every family of ``FAMILIES`` on one registry; ``rank`` gives each data-parallel scheduler its sink."""

    def __init__(self, registry: CollectorRegistry, *, model_name: str, options: SglangOptions,
                 tp_size: int) -> None:
        self.registry = registry
        self.model_name = model_name
        self.options = options
        self.tp_size = tp_size
        buckets = {"ttft": options.ttft_buckets, "itl": options.itl_buckets, "e2e": options.e2e_buckets,
                   "tokens": TOKEN_BUCKETS, "queue": QUEUE_TIME_BUCKETS}
        self.families: dict[str, Counter | Gauge | Histogram] = {}
        for spec in FAMILIES:
            labels = [*_base_labels(spec.scope, options.dp_size), *spec.extra]
            if spec.kind == "counter":
                self.families[spec.name] = Counter(spec.name, spec.doc, labels, registry=registry)
            elif spec.kind == "gauge":
                self.families[spec.name] = Gauge(spec.name, spec.doc, labels, registry=registry)
            else:
                assert spec.buckets is not None
                self.families[spec.name] = Histogram(spec.name, spec.doc, labels, registry=registry,
                                                     buckets=buckets[spec.buckets])
        self.server = {"model_name": model_name, "engine_type": ENGINE_TYPE}

    def counter(self, name: str) -> Counter:
        family = self.families[name]
        assert isinstance(family, Counter)
        return family

    def gauge(self, name: str) -> Gauge:
        family = self.families[name]
        assert isinstance(family, Gauge)
        return family

    def histogram(self, name: str) -> Histogram:
        family = self.families[name]
        assert isinstance(family, Histogram)
        return family

    def rank_labels(self, *, tp_rank: int, dp_rank: int | None) -> dict[str, str]:
        labels = {**self.server, "tp_rank": str(tp_rank), "pp_rank": "0", "moe_ep_rank": "0"}
        if dp_rank is not None:
            labels["dp_rank"] = str(dp_rank)
        return labels

    def rank(self, *, dp_rank: int | None, scheduler: Scheduler, clock: Clock, context_len: int) -> RankMetrics:
        """The sink of one data-parallel scheduler (``dp_rank`` None: SGLang without a data-parallel controller).

        Every tensor-parallel rank's scheduler pre-creates its prefill-source counters; only rank 0 reports."""
        for tp_rank in range(self.tp_size):
            for mode in PREFILL_MODES:
                self.counter("sglang:prefill_effective_tokens_total").labels(
                    **self.rank_labels(tp_rank=tp_rank, dp_rank=dp_rank), mode=mode)
        return RankMetrics(self, self.rank_labels(tp_rank=0, dp_rank=dp_rank), scheduler, clock, context_len)

    def http_started(self, endpoint: str, method: str) -> None:
        self.counter("sglang:http_requests_total").labels(endpoint=endpoint, method=method).inc()
        self.gauge("sglang:http_requests_active").labels(endpoint=endpoint, method=method).inc()

    def http_ended(self, endpoint: str, method: str, status: int) -> None:
        self.counter("sglang:http_responses_total").labels(endpoint=endpoint, method=method,
                                                           status_code=str(status)).inc()
        self.gauge("sglang:http_requests_active").labels(endpoint=endpoint, method=method).dec()


class RankMetrics:
    """One scheduler's families and the server's request families, fed by one engine (``sink.MetricsSink``).

    As in SGLang, the scheduler's gauges move only when it reports (after a prefill batch, every
    ``DECODE_LOG_INTERVAL`` decode steps, and when its batch empties), a finished request's tokens are counted
    when it finishes, a request whose client went away counts only as aborted, and a hung scheduler's gauges keep
    their last values while the server's families go on counting what the server sees."""

    def __init__(self, metrics: SglangMetrics, labels: dict[str, str], scheduler: Scheduler, clock: Clock,
                 context_len: int) -> None:
        self.metrics = metrics
        self.labels = labels
        self.scheduler = scheduler
        self.clock = clock
        self.frozen = False
        self._arrivals: dict[Sequence, float] = {}
        self._quiet: set[Sequence] = set()  # health-check probes: the scheduler leaves them out of its counters
        self._steps = 0
        self._decoded = 0
        self._last_report = clock.now()
        self._hits: deque[tuple[float, int, int]] = deque()
        tokens = scheduler.total_blocks * scheduler.block_size
        for name, value in (("sglang:max_total_num_tokens", tokens), ("sglang:page_size", scheduler.block_size),
                            ("sglang:num_pages", scheduler.total_blocks), ("sglang:context_len", context_len)):
            self._gauge(name, value)

    def _gauge(self, name: str, value: float) -> None:
        self.metrics.gauge(name).labels(**self.labels).set(value)

    def _count(self, name: str, amount: float = 1, *, server: bool = False, **extra: str) -> None:
        labels = self.metrics.server if server else self.labels
        self.metrics.counter(name).labels(**labels, **extra).inc(amount)

    def _observe(self, name: str, value: float, *, server: bool = False, **extra: str) -> None:
        labels = self.metrics.server if server else self.labels
        self.metrics.histogram(name).labels(**labels, **extra).observe(value)

    def freeze(self, *, zero_scheduler_gauges: bool) -> None:
        self.frozen = True  # a stuck scheduler reports nothing: its gauges keep their last values

    def request_submitted(self, handle: RequestHandle) -> None:
        if handle.log_metrics:
            self._arrivals[handle.seq] = handle.arrival
        else:
            self._quiet.add(handle.seq)

    def prefix_queried(self, prompt_tokens: int) -> None:
        pass  # counted per prefill, when the prompt is computed

    def prefix_hit(self, cached_tokens: int) -> None:
        pass

    def step_scheduled(self, plan: StepPlan) -> None:
        now = self.clock.now()
        for seq in plan.newly_admitted:
            arrival = self._arrivals.get(seq)
            if arrival is not None:
                self._observe("sglang:queue_time_seconds", now - arrival)
        if plan.preempted:
            self._count("sglang:num_retracted_requests_total", len(plan.preempted))
            self._count("sglang:num_retracted_input_tokens_total", sum(s.prompt_tokens for s in plan.preempted))
            self._count("sglang:num_retracted_output_tokens_total", sum(s.generated for s in plan.preempted))

    def step_ran(self, plan: StepPlan, seconds: float) -> None:
        if all(seq in self._quiet for seq in plan.scheduled):
            return
        category = "extend" if plan.newly_admitted or plan.prefill_tokens else "decode"
        self._count("sglang:forward_execution_seconds_total", seconds, category=category)

    def prefill_done(self, seq: Sequence) -> None:
        if seq in self._quiet:
            return
        computed, cached = seq.prompt_tokens - seq.cached_tokens, seq.cached_tokens
        self._count("sglang:realtime_tokens_total", computed, mode="prefill_compute")
        self._count("sglang:realtime_tokens_total", cached, mode="prefill_cache")
        self._count("sglang:prefill_effective_tokens_total", seq.prompt_tokens, mode="input")
        self._count("sglang:prefill_effective_tokens_total", cached, mode="device_hit")
        self._hits.append((self.clock.now(), cached, seq.prompt_tokens))

    def token_emitted(self, handle: RequestHandle, gap: float | None) -> None:
        if gap is None or not handle.log_metrics:
            return  # a first token comes out of the prefill batch
        self._decoded += 1
        self._count("sglang:realtime_tokens_total", mode="decode")
        self._observe("sglang:inter_token_latency_seconds", gap, server=True)

    def first_token_sent(self, handle: RequestHandle, ttft: float) -> None:
        if handle.log_metrics:
            self._observe("sglang:time_to_first_token_seconds", ttft, server=True, is_streaming=_flag(handle.stream))

    def request_finished(self, handle: RequestHandle, reason: str, now: float) -> None:
        self._forget(handle)
        if reason == "abort" or not handle.log_metrics:
            return  # the server forgets a request whose client left (request_aborted counted it)
        seq, streaming = handle.seq, _flag(handle.stream)
        self._count("sglang:prompt_tokens_total", seq.prompt_tokens, server=True, is_streaming=streaming)
        self._count("sglang:generation_tokens_total", seq.generated, server=True, is_streaming=streaming)
        self._count("sglang:num_requests_total", server=True, is_streaming=streaming)
        if seq.cached_tokens:
            self._count("sglang:cached_tokens_total", seq.cached_tokens, server=True, cache_source="device")
        self._observe("sglang:e2e_request_latency_seconds", now - handle.arrival, server=True, is_streaming=streaming)
        if seq.generated > 1 and handle.first_token is not None and now > handle.first_token:
            self._observe("sglang:request_time_per_output_token_seconds",
                          (now - handle.first_token) / (seq.generated - 1), server=True, is_streaming=streaming)
        self._observe("sglang:prompt_tokens_histogram", seq.prompt_tokens, server=True)
        self._observe("sglang:uncached_prompt_tokens_histogram", seq.prompt_tokens - seq.cached_tokens, server=True)
        self._observe("sglang:generation_tokens_histogram", seq.generated, server=True)

    def request_failed(self, handle: RequestHandle, reason: str) -> None:
        self._forget(handle)  # the server dies or stops with it: nothing is reported

    def request_aborted(self, handle: RequestHandle) -> None:
        self._forget(handle)
        if handle.log_metrics:
            self._count("sglang:num_aborted_requests_total", server=True)

    def _forget(self, handle: RequestHandle) -> None:
        self._arrivals.pop(handle.seq, None)
        self._quiet.discard(handle.seq)

    def error_answered(self) -> None:
        pass  # SGLang counts it only as an HTTP 500 (sglang:http_responses_total)

    def set_scheduler_state(self, *, running: int, waiting: int, waiting_for_capacity: int, kv_usage: float,
                            step: StepPlan | None = None) -> None:
        if self.frozen:
            return
        if step is not None:
            self._steps += 1
            prefill = bool(step.newly_admitted or step.prefill_tokens)
            if not (prefill or self._steps % DECODE_LOG_INTERVAL == 0 or running == 0):
                return
        elif running:
            return  # between steps only an emptied batch is reported at once
        self._report(running, waiting, kv_usage)

    def _report(self, running: int, waiting: int, kv_usage: float) -> None:
        now = self.clock.now()
        s = self.scheduler
        used = (s.total_blocks - s.free_blocks) * s.block_size
        elapsed, self._last_report = now - self._last_report, now
        throughput, self._decoded = (self._decoded / elapsed if elapsed > 0 else 0.0), 0
        while self._hits and self._hits[0][0] <= now - CACHE_HIT_WINDOW_S:
            self._hits.popleft()
        total = sum(t for _, _, t in self._hits)
        for name, value in (
                ("sglang:num_running_reqs", running), ("sglang:num_queue_reqs", waiting),
                ("sglang:token_usage", kv_usage), ("sglang:full_token_usage", kv_usage),
                ("sglang:num_used_tokens", used), ("sglang:kv_used_tokens", used),
                ("sglang:kv_available_tokens", s.free_blocks * s.block_size), ("sglang:kv_evictable_tokens", 0),
                ("sglang:gen_throughput", throughput),
                ("sglang:cache_hit_rate", sum(h for _, h, _ in self._hits) / total if total else 0.0),
                ("sglang:decode_sum_seq_lens", sum(seq.num_tokens for seq in s.running))):
            self._gauge(name, value)


def _flag(value: bool) -> str:
    return "true" if value else "false"
