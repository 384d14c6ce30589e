"""Selectors narrowed by a dashboard's variables, and the series names and matchers an expression uses.

``Scope.sel`` writes every selector of a board: each series gets ``label=~"$label"`` for every variable of the
board that the series carries as a label (``.*`` for "All"), so no panel forgets a filter. ``selectors`` reads
them back (for the tests): a small tokenizer, enough for the expressions of these dashboards and rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engines import ADAPTERS

# Every engine's own series start with its adapter's prefix (vllm:, sglang:).
ENGINE_PREFIXES = tuple(a.metric_prefix for a in ADAPTERS.values())
_REPLICA = ("node", "model", "replica", "engine")

# The labels of each family of series that a dashboard variable can filter on, by name prefix.
#   vllm:*, sglang:*   each replica's own engine /metrics, with the scrape job's target labels node, replica,
#                      model and engine
#   model_engine:*     recording rules aggregated by model and engine
#   model:*            recording rules aggregated by model
#   pitstop_*          the agent's series (gpu on GPU series; replica, model and engine on replica series)
# Control-plane series (pitstop_cp_*), pitstop_build_info and up carry none of these.
SERIES_LABELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((prefix, _REPLICA) for prefix in ENGINE_PREFIXES),
    ("model_engine:", ("model", "engine")),
    ("model:", ("model",)),
    ("pitstop_cp_", ()),
    ("pitstop_gpu_", ("node", "gpu")),
    ("pitstop_node_", ("node",)),
    ("pitstop_replica_", _REPLICA),
    ("pitstop_engine_", _REPLICA),
    ("pitstop_canary_", _REPLICA),
)

# The engines' series are read from the engines' job only: another job scraping an engine directly (without the
# fleet's labels, so matching "All") would otherwise be summed in; the recording rules do the same.
ENGINES_JOB = 'job="pitstop-engines"'

KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "atan2", "inf", "nan", "start", "end",
})
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<matchers>\{(?:[^}"']|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')*\})
  | (?P<range>\[[^\]]*\])
  | (?P<number>\d[\w.]*)
  | (?P<variable>\$\{?\w+(?::\w+)?\}?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<other>\S)
""", re.VERBOSE)
_MATCHER = re.compile(r"""([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)\"""")


def series_labels(metric: str) -> tuple[str, ...]:
    for prefix, labels in SERIES_LABELS:
        if metric.startswith(prefix):
            return labels
    return ()


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)

    def value(self, label: str, op: str = "=~") -> str | None:
        return next((v for name, o, v in self.matchers if name == label and o == op), None)


def selectors(expr: str) -> list[Selector]:
    """Every series selector of ``expr``: its metric name and its label matchers."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr)]
    found: list[Selector] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "ident" and text in _GROUPING and following == ("other", "("):
            while i < len(tokens) and tokens[i] != ("other", ")"):  # by (model, le): labels, not series
                i += 1
        elif kind == "ident" and text not in KEYWORDS and following != ("other", "("):
            matchers: tuple[tuple[str, str, str], ...] = ()
            if following[0] == "matchers":
                matchers = tuple(_MATCHER.findall(following[1]))
                i += 1
            found.append(Selector(text, matchers))
        i += 1
    return found


def metric_names(expr: str) -> set[str]:
    return {s.metric for s in selectors(expr)}


@dataclass(frozen=True)
class Scope:
    """A board's filtering variables; ``sel`` narrows a series by those of them it carries as labels."""

    variables: tuple[str, ...]

    def sel(self, metric: str, *matchers: str) -> str:
        filters = [f'{label}=~"${label}"' for label in series_labels(metric) if label in self.variables]
        job = [ENGINES_JOB] if metric.startswith(ENGINE_PREFIXES) else []
        inner = ", ".join([*job, *matchers, *filters])
        return f"{metric}{{{inner}}}" if inner else metric

    def alerts(self, names: tuple[str, ...], *, labels: tuple[str, ...] | None = None,
               required: tuple[str, ...] = ()) -> str:
        """Pitstop's firing alerts by name, narrowed by the board's variables (or only ``labels`` of them): an
        alert without one of those labels (a model's SLO alert under a node filter) still matches, through the
        empty alternative, unless the label is ``required``."""
        chosen = self.variables if labels is None else labels
        filters = [f'{v}=~"${v}"' if v in required else f'{v}=~"${v}|"' for v in chosen]
        regex = "|".join(names)
        return ", ".join([f'ALERTS{{alertstate="firing", alertname=~"{regex}"', *filters]) + "}"
