"""How an engine's /metrics become one ``EngineSample``: which series are read, and how two scrapes become rates,
window quantiles and the window's histograms.

Which series an engine has is its adapter's table (``engines/``: ``engines/vllm.py``, ``engines/sglang.py``), the
single list of engine metrics read (dcgm-exporter's counters file, in code); this module reads any adapter's.

``errors_per_second`` is the users' errors: the agent's own canaries that it cut at their deadline are aborted
requests in ``errors`` too, and ``engine_sample`` leaves out as many as it is told (``agent.scrape``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter

from agent.prom_lines import PromTextError, SampleSelector, SeriesError, Shape
from agent.quantiles import bucket_delta, quantile
from agent.wire import MAX_BUCKETS, EngineSample, EngineWindow, WindowHistogram, bounded
from engines import DEFAULT_ADAPTER, EngineAdapter, EngineMetric


class MetricsParseError(ValueError):
    """The /metrics body is not Prometheus text, or holds none of the engine's metrics."""


@dataclass
class EngineSnapshot:
    """Values of the table's metrics in one scrape, taken at monotonic time ``at``."""

    at: float
    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def wanted_names(engine: EngineAdapter = DEFAULT_ADAPTER) -> frozenset[str]:
    """The sample names of ``engine``'s table, as they appear on /metrics (a histogram's ``_bucket`` lines)."""
    names: set[str] = set()
    for metric in engine.metrics:
        suffix = "_bucket" if metric.kind == "histogram" else ""
        names.update(name + suffix for name in metric.names)
    return frozenset(names)


# Per engine: an immutable pattern plus a bounded cache of parsed label blocks.
_SELECTORS: dict[str, SampleSelector] = {}


def _selector(engine: EngineAdapter) -> SampleSelector:
    selector = _SELECTORS.get(engine.name)
    if selector is None:
        selector = _SELECTORS[engine.name] = SampleSelector(wanted_names(engine))
    return selector


def parse_metrics(text: str, at: float, model: str | None = None,
                  engine: EngineAdapter = DEFAULT_ADAPTER) -> EngineSnapshot:
    """Parse ``engine``'s /metrics text into an ``EngineSnapshot``; series of other models are ignored when
    ``model`` is given (the adapter's model label); series of several ranks are combined.

    What is summed, on purpose: a name's distinct series, i.e. the data-parallel ranks (vLLM's ``engine``
    label, SGLang's ``dp_rank``) and, for ``requests``, the finished reasons; histogram buckets per ``le``
    likewise. What counts once: series that differ only in a label the adapter names a copy (tensor and pipeline
    ranks report one batch each): the lowest rank's (``_one_copy``). What is never summed: one series sent twice,
    or a body past ``prom_lines.MAX_SAMPLES`` wanted samples (an engine streaming the same lines without end read
    3,679,000 requests running): both are a ``MetricsParseError``.

    Only the table's sample lines are parsed (``agent.prom_lines``): at a 1 s scrape of 8 engines,
    prometheus_client's full parser was the agent's largest CPU cost. Which line goes into which figure is
    worked out once per shape of body (``_Plan``): an engine sends the same series scrape after scrape, only
    their values change, so a scrape is then a regular-expression pass, a float per line and the sums."""
    try:
        selector = _selector(engine)
        shaped = selector.shaped(text)
        if shaped is None:  # a line only the exact parser reads (a float timestamp, say): planned afresh
            samples = selector.select(text)
            values: list[float] = []
            indexed: dict[str, list[tuple[dict[str, str], int]]] = {}
            for name, found in samples.items():
                for labels, value in found:
                    indexed.setdefault(name, []).append((labels, len(values)))
                    values.append(value)
            plan = _Plan.build(indexed, model, engine)
        else:
            shape, values = shaped
            plan = _plan_for(shape, model, engine)
    except SeriesError as exc:
        raise MetricsParseError(f"engine /metrics refused: {exc}") from exc
    except PromTextError as exc:
        raise MetricsParseError(f"unparsable /metrics: {exc}") from exc
    if not values:
        raise MetricsParseError(f"unparsable /metrics: none of the {engine.metric_prefix} series the agent reads")
    return plan.apply(values, at)


Indices = tuple[int, ...]


@dataclass
class _Plan:
    """Which of a body's wanted samples (by position) make each figure of the table."""

    scalars: tuple[tuple[str, bool, Indices], ...]  # key, whether the largest (gauge-max) or the sum
    histograms: tuple[tuple[str, tuple[tuple[float, Indices], ...]], ...]  # key, (le, samples) per bucket

    @classmethod
    def build(cls, indexed: dict[str, list[tuple[dict[str, str], int]]], model: str | None,
              engine: EngineAdapter = DEFAULT_ADAPTER) -> _Plan:
        """The plan for samples grouped by name, each as (labels, position); ``MetricsParseError`` for a bucket
        bound that is no number."""
        model_label, copies = engine.model_label, engine.copy_labels

        def rows(name: str, metric: EngineMetric) -> list[tuple[dict[str, str], int]]:
            out = [(lb, i) for lb, i in indexed.get(name, []) if model is None or lb.get(model_label, model) == model]
            for label, allowed in metric.filters:
                out = [(lb, i) for lb, i in out if lb.get(label) in allowed]
            return _one_copy(out, copies) if copies else out

        scalars: list[tuple[str, bool, Indices]] = []
        histograms: list[tuple[str, tuple[tuple[float, Indices], ...]]] = []
        for metric in engine.metrics:
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


def _one_copy(rows: list[tuple[dict[str, str], int]],
              copies: frozenset[str]) -> list[tuple[dict[str, str], int]]:
    """Of series that differ only in ``copies`` labels (tensor and pipeline ranks, which report one batch each),
    the lowest rank's: the others are the same figure again, and summing them would count one batch per rank."""
    kept: dict[frozenset[tuple[str, str]], tuple[tuple[str, ...], dict[str, str], int]] = {}
    for labels, i in rows:
        series = frozenset((k, v) for k, v in labels.items() if k not in copies)
        rank = tuple(labels.get(k, "") for k in sorted(copies))
        held = kept.get(series)
        if held is None or rank < held[0]:
            kept[series] = (rank, labels, i)
    return sorted(((labels, i) for _, labels, i in kept.values()), key=lambda row: row[1])


_PLANS: dict[tuple[str, Shape, str | None], _Plan] = {}
_MAX_PLANS = 64  # one per kind of engine and model; bounded all the same


def _plan_for(shape: Shape, model: str | None, engine: EngineAdapter = DEFAULT_ADAPTER) -> _Plan:
    plan = _PLANS.get((engine.name, shape, model))
    if plan is None:
        selector = _selector(engine)
        indexed: dict[str, list[tuple[dict[str, str], int]]] = {}
        for i, (name, block) in enumerate(shape):
            indexed.setdefault(name, []).append((selector.labels_of(block), i))
        plan = _Plan.build(indexed, model, engine)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[(engine.name, shape, model)] = plan
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


def _errors(cur: EngineSnapshot, prev: EngineSnapshot | None, own: float) -> float | None:
    """Users' failed requests per second: ``errors`` (the agent's own ``own`` aborted canaries left out) plus,
    where the engine counts them apart (SGLang's HTTP 5xx), ``server_errors``."""
    errors = _rate("errors", cur, prev, less=own)
    server = _rate("server_errors", cur, prev)
    if server is None:
        return errors
    return server + (errors or 0.0)


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
        "errors_per_second": _errors(cur, prev, own_errors),
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
