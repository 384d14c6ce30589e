"""The engines' own series in a board's PromQL, whichever engine a replica runs.

Which series an engine publishes is its adapter's table (``engines/``). ``rate`` writes the per-second rate of
one or more of those figures (counters, or a histogram's ``_bucket``) for every engine that has them, as one
vector, the way the recording rules of ``alerts/pitstop-rules.yml`` read them: within an engine an older sample
name is read where the current one is absent (``or``: after ``rate`` both carry the same labels), the series of
two figures are a union (an engine's error counters never share a label set: its HTTP answers carry an
``endpoint``), and the copies of one figure (SGLang's tensor and pipeline ranks, which report the same batch)
count once (``max without`` them). Engines are joined with ``or`` too: each series carries its target's
``engine`` label, so two engines' series never match, and a quantile summed ``by (le, engine)`` never adds two
engines' bucket bounds together.
"""

from __future__ import annotations

import re

from engines import ADAPTERS, EngineAdapter, EngineMetric
from pitstop.boards.promql import Scope

# Each engine's cap on running requests, the flag the governor lowers ("vLLM --max-num-seqs, SGLang ...").
RUNNING_CAPS = ", ".join(f"{a.title} {a.governed_flag}" for a in ADAPTERS.values())
_SERVER_ERRORS = frozenset(str(code) for code in range(500, 600))


def matcher_regex(values: frozenset[str]) -> str:
    """A PromQL regex that matches exactly ``values``: every HTTP 5xx status as ``5..``, other values listed."""
    if values == _SERVER_ERRORS:
        return "5.."
    return "|".join(re.escape(v) for v in sorted(values))


def _metric_rate(scope: Scope, metric: EngineMetric, suffix: str, window: str) -> str:
    matchers = [f'{label}=~"{matcher_regex(values)}"' for label, values in metric.filters]
    return " or ".join(f"rate({scope.sel(name + suffix, *matchers)}[{window}])" for name in metric.names)


def _engine_rate(scope: Scope, engine: EngineAdapter, keys: tuple[str, ...], suffix: str,
                 window: str) -> str | None:
    metrics = [m for key in keys if (m := engine.metric(key)) is not None]
    if not metrics:
        return None
    expr = " or ".join(_metric_rate(scope, m, suffix, window) for m in metrics)
    if engine.copy_labels:
        return f"max without ({', '.join(sorted(engine.copy_labels))}) ({expr})"
    return expr


def rate(scope: Scope, *keys: str, suffix: str = "", window: str = "$__rate_interval") -> str:
    """The rate of the figures ``keys`` (``ttft``, ``requests``, ``errors`` ...: the adapters' keys) of every
    engine's replicas, narrowed by the board's variables; ``suffix`` picks a histogram's samples (``_bucket``)."""
    parts = [part for engine in ADAPTERS.values()
             if (part := _engine_rate(scope, engine, keys, suffix, window)) is not None]
    if not parts:
        raise ValueError(f"no engine's adapter has a figure among {keys}")
    return " or ".join(parts)


def names(*keys: str) -> str:
    """Each engine's current sample names of the figures ``keys``, for a panel's description."""
    return ", ".join(metric.names[0] for engine in ADAPTERS.values() for key in keys
                     if (metric := engine.metric(key)) is not None)
