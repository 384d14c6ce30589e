"""Which vLLM /metrics series the agent reads, and how two scrapes become one ``EngineSample``.

The table below is the single list of engine metrics read (dcgm-exporter's counters file, in code). Each row
names the current vLLM 0.33 sample name first, then older names read when the current one is absent
(vLLM renamed ``gpu_cache_usage_perc`` → ``kv_cache_usage_perc``, ``time_per_output_token_seconds`` →
``inter_token_latency_seconds``, ``gpu_prefix_cache_*`` → ``prefix_cache_*``).

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

``errors_per_second`` is the users' errors: the agent's own canaries that it cut at their deadline are aborted
requests in ``errors`` too, and ``engine_sample`` leaves out as many as it is told (``agent.scrape``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Literal

from agent.prom_lines import PromTextError, SampleSelector, SeriesError, Shape
from agent.quantiles import bucket_delta, quantile
from agent.wire import MAX_BUCKETS, EngineSample, EngineWindow, WindowHistogram, bounded

Kind = Literal["gauge", "gauge-max", "counter", "histogram"]


@dataclass(frozen=True)
class EngineMetric:
    key: str
    kind: Kind
    names: tuple[str, ...]
    # Only samples whose label matches one of these values count (e.g. finished_reason=error|abort).
    label: tuple[str, frozenset[str]] | None = None


ENGINE_METRICS: tuple[EngineMetric, ...] = (
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
    EngineMetric("prefix_hits", "counter", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
    EngineMetric("ttft", "histogram", ("vllm:time_to_first_token_seconds",)),
    EngineMetric("itl", "histogram", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
    EngineMetric("e2e", "histogram", ("vllm:e2e_request_latency_seconds",)),
    EngineMetric("steps", "histogram", ("vllm:iteration_tokens_total",)),
)


class MetricsParseError(ValueError):
    """The /metrics body is not Prometheus text, or holds none of vLLM's metrics."""


@dataclass
class EngineSnapshot:
    """Values of the table's metrics in one scrape, taken at monotonic time ``at``."""

    at: float
    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def _wanted_names() -> frozenset[str]:
    names: set[str] = set()
    for metric in ENGINE_METRICS:
        suffix = "_bucket" if metric.kind == "histogram" else ""
        names.update(name + suffix for name in metric.names)
    return frozenset(names)


WANTED_NAMES = _wanted_names()
_SELECTOR = SampleSelector(WANTED_NAMES)  # immutable pattern plus a bounded cache of parsed label blocks


def parse_metrics(text: str, at: float, model: str | None = None) -> EngineSnapshot:
    """Parse vLLM /metrics text into an ``EngineSnapshot``; series of other models are ignored when
    ``model`` is given (label ``model_name``); series of several engines (data parallel) are summed.

    What is summed, on purpose: a name's distinct series, i.e. the ranks of a data-parallel engine (label
    ``engine``) and, for ``requests``, the finished reasons; histogram buckets per ``le`` likewise. What is
    never summed: one series sent twice, or a body past ``prom_lines.MAX_SAMPLES`` wanted samples (an engine
    streaming the same lines without end read 3,679,000 requests running): both are a ``MetricsParseError``.

    Only the table's sample lines are parsed (``agent.prom_lines``): at a 1 s scrape of 8 engines,
    prometheus_client's full parser was the agent's largest CPU cost. Which line goes into which figure is
    worked out once per shape of body (``_Plan``): an engine sends the same series scrape after scrape, only
    their values change, so a scrape is then a regular-expression pass, a float per line and the sums."""
    try:
        shaped = _SELECTOR.shaped(text)
        if shaped is None:  # a line only the exact parser reads (a float timestamp, say): planned afresh
            samples = _SELECTOR.select(text)
            values: list[float] = []
            indexed: dict[str, list[tuple[dict[str, str], int]]] = {}
            for name, found in samples.items():
                for labels, value in found:
                    indexed.setdefault(name, []).append((labels, len(values)))
                    values.append(value)
            plan = _Plan.build(indexed, model)
        else:
            shape, values = shaped
            plan = _plan_for(shape, model)
    except SeriesError as exc:
        raise MetricsParseError(f"engine /metrics refused: {exc}") from exc
    except PromTextError as exc:
        raise MetricsParseError(f"unparsable /metrics: {exc}") from exc
    if not values:
        raise MetricsParseError("unparsable /metrics: none of the vllm: series the agent reads")
    return plan.apply(values, at)


Indices = tuple[int, ...]


@dataclass
class _Plan:
    """Which of a body's wanted samples (by position) make each figure of the table."""

    scalars: tuple[tuple[str, bool, Indices], ...]  # key, whether the largest (gauge-max) or the sum
    histograms: tuple[tuple[str, tuple[tuple[float, Indices], ...]], ...]  # key, (le, samples) per bucket

    @classmethod
    def build(cls, indexed: dict[str, list[tuple[dict[str, str], int]]], model: str | None) -> _Plan:
        """The plan for samples grouped by name, each as (labels, position); ``MetricsParseError`` for a bucket
        bound that is no number."""
        def rows(name: str, metric: EngineMetric) -> list[tuple[dict[str, str], int]]:
            out = [(lb, i) for lb, i in indexed.get(name, []) if model is None or lb.get("model_name", model) == model]
            if metric.label is not None:
                label, allowed = metric.label
                out = [(lb, i) for lb, i in out if lb.get(label) in allowed]
            return out

        scalars: list[tuple[str, bool, Indices]] = []
        histograms: list[tuple[str, tuple[tuple[float, Indices], ...]]] = []
        for metric in ENGINE_METRICS:
            if metric.kind == "histogram":
                for base in metric.names:
                    buckets: dict[float, list[int]] = defaultdict(list)
                    for labels, i in rows(base + "_bucket", metric):
                        try:
                            buckets[_le(labels.get("le", "+Inf"))].append(i)
                        except ValueError as exc:
                            raise MetricsParseError(f"bad bucket bound in {base}: {exc}") from exc
                    if buckets:
                        histograms.append((metric.key, tuple((le, tuple(ix)) for le, ix in buckets.items())))
                        break
                continue
            for name in metric.names:
                if name in indexed:
                    scalars.append((metric.key, metric.kind == "gauge-max", tuple(i for _, i in rows(name, metric))))
                    break
        return cls(tuple(scalars), tuple(histograms))

    def __post_init__(self) -> None:
        # One engine (the usual case): each bucket is one sample, read with one C call per histogram.
        self._simple = {key: (tuple(le for le, _ in buckets), itemgetter(*(ix[0] for _, ix in buckets)))
                        for key, buckets in self.histograms
                        if len(buckets) > 1 and all(len(ix) == 1 for _, ix in buckets)}

    def apply(self, values: list[float], at: float) -> EngineSnapshot:
        snap = EngineSnapshot(at=at)
        for key, largest, indices in self.scalars:
            if len(indices) == 1:
                snap.values[key] = values[indices[0]]
                continue
            picked = [values[i] for i in indices]
            snap.values[key] = max(picked, default=0.0) if largest else sum(picked)
        for key, buckets in self.histograms:
            simple = self._simple.get(key)
            if simple is not None:
                snap.histograms[key] = dict(zip(simple[0], simple[1](values), strict=True))
            else:
                snap.histograms[key] = {le: sum([values[i] for i in indices]) for le, indices in buckets}
        return snap


_PLANS: dict[tuple[Shape, str | None], _Plan] = {}
_MAX_PLANS = 64  # one per kind of engine and model; bounded all the same


def _plan_for(shape: Shape, model: str | None) -> _Plan:
    plan = _PLANS.get((shape, model))
    if plan is None:
        indexed: dict[str, list[tuple[dict[str, str], int]]] = {}
        for i, (name, block) in enumerate(shape):
            indexed.setdefault(name, []).append((_SELECTOR.labels_of(block), i))
        plan = _Plan.build(indexed, model)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[(shape, model)] = plan
    return plan


def counter_delta(key: str, cur: EngineSnapshot, prev: EngineSnapshot | None) -> float | None:
    """How much counter ``key`` grew from ``prev`` to ``cur``; None unless both scrapes have it."""
    if prev is None or key not in cur.values or key not in prev.values:
        return None
    delta = cur.values[key] - prev.values[key]
    # A counter that went down means the engine restarted: count from zero, never a negative rate.
    return cur.values[key] if delta < 0 else delta


def _rate(key: str, cur: EngineSnapshot, prev: EngineSnapshot | None, less: float = 0.0) -> float | None:
    """Counter ``key``'s growth per second over the window, ``less`` of it left out (never below 0)."""
    delta = counter_delta(key, cur, prev)
    if delta is None or prev is None or cur.at <= prev.at:
        return None
    return max(0.0, delta - less) / (cur.at - prev.at)


def _window_deltas(cur: EngineSnapshot, prev: EngineSnapshot | None) -> dict[str, dict[float, float]]:
    """Each histogram of ``cur`` over the window since ``prev`` (none without it), computed once a scrape for the
    quantiles and the window's histograms alike."""
    if prev is None:
        return {}
    return {key: bucket_delta(buckets, prev.histograms.get(key)) for key, buckets in cur.histograms.items()}


def _window_quantiles(window: dict[float, float] | None, qs: tuple[float, ...]) -> list[float | None]:
    if window is None:
        return [None for _ in qs]
    return [quantile(q, window) for q in qs]


def _window_histogram(window: dict[float, float] | None) -> WindowHistogram | None:
    """One histogram over the window as counts per bucket; None when the engine has none or saw nothing."""
    if window is None:
        return None
    bounds = sorted(window)
    if not bounds or not math.isinf(bounds[-1]) or len(bounds) > MAX_BUCKETS + 1:
        return None
    cumulative = [window[le] for le in bounds]
    counts = [max(0.0, c - before) for c, before in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]
    if not sum(counts) or not all(math.isfinite(c) for c in counts):
        return None
    return WindowHistogram(bounds=bounds[:-1], counts=counts)


def _engine_window(cur: EngineSnapshot, prev: EngineSnapshot | None, ended_at: datetime | None,
                   deltas: dict[str, dict[float, float]]) -> EngineWindow | None:
    """The per-request latencies observed between two scrapes (``deltas``: their ``_window_deltas``), for judging
    a canary on evidence."""
    if prev is None or ended_at is None or cur.at <= prev.at:
        return None
    steps = None if "steps" not in deltas else bounded(deltas["steps"].get(math.inf), 0.0, math.inf)
    return EngineWindow(ended_at=ended_at, seconds=cur.at - prev.at, steps=steps,
                        ttft=_window_histogram(deltas.get("ttft")), itl=_window_histogram(deltas.get("itl")))


_RATIOS = frozenset({"kv_cache_usage_ratio", "prefix_cache_hit_ratio"})


def engine_sample(cur: EngineSnapshot, prev: EngineSnapshot | None, stalled: bool | None = None,
                  own_errors: float = 0.0, ended_at: datetime | None = None) -> EngineSample:
    """Gauges from ``cur``; rates and window quantiles from ``cur - prev`` (``None`` without ``prev``).
    ``own_errors``: errors of the window that were the agent's own aborted canaries, left out of the rate.
    ``ended_at``: the wall clock at ``cur``, which names the window's histograms (none without it)."""
    v = cur.values
    deltas = _window_deltas(cur, prev)
    ttft = _window_quantiles(deltas.get("ttft"), (0.5, 0.95, 0.99))
    itl = _window_quantiles(deltas.get("itl"), (0.5, 0.95, 0.99))
    (e2e99,) = _window_quantiles(deltas.get("e2e"), (0.99,))
    hit_ratio = None
    if prev is not None and "prefix_queries" in v and "prefix_queries" in prev.values:
        queries = _rate("prefix_queries", cur, prev)
        hits = _rate("prefix_hits", cur, prev)
        if queries and hits is not None:
            hit_ratio = min(1.0, hits / queries)
    readings: dict[str, float | None] = {
        "requests_running": v.get("running"),
        "requests_waiting": v.get("waiting"),
        "kv_cache_usage_ratio": v.get("kv_usage"),
        "preemptions_total": v.get("preemptions"),
        "generation_tokens_total": v.get("generation_tokens"),
        "prompt_tokens_per_second": _rate("prompt_tokens", cur, prev),
        "generation_tokens_per_second": _rate("generation_tokens", cur, prev),
        "requests_per_second": _rate("requests", cur, prev),
        "errors_per_second": _rate("errors", cur, prev, less=own_errors),
        "preemptions_per_second": _rate("preemptions", cur, prev),
        "ttft_p50_seconds": ttft[0], "ttft_p95_seconds": ttft[1], "ttft_p99_seconds": ttft[2],
        "itl_p50_seconds": itl[0], "itl_p95_seconds": itl[1], "itl_p99_seconds": itl[2],
        "e2e_p99_seconds": e2e99,
        "prefix_cache_hit_ratio": hit_ratio,
    }
    # An engine's NaN, +Inf or negative number (or a window over one) is no reading: it goes as None, never as a
    # value the control plane refuses with the whole report.
    return EngineSample(stalled=stalled, window=_engine_window(cur, prev, ended_at, deltas), **{
        name: bounded(value, 0.0, 1.0 if name in _RATIOS else math.inf) for name, value in readings.items()})
