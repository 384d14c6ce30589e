"""Read the repository's alert rules, promtool tests and dashboards, and the series the exporters declare."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from agent.exporter import AgentCollector, ExportState
from agent.wire import EngineSample, GpuSample, ProcessSample, ReplicaState, ReplicaStatus
from controlplane.api.store_metrics import StoreReading
from controlplane.api.telemetry import Telemetry
from engines import ADAPTERS, SGLANG, VLLM
from enginesim import sglang as sglang_sim
from enginesim.metrics import ITL_BUCKETS, TTFT_BUCKETS

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "pitstop-rules.yml"
# Rules carry absolute runbook links (clickable in Alertmanager and Grafana) under this documented base.
RUNBOOK_BASE = "https://pitstop.example.internal/"


def runbook_file(url: str) -> Path:
    """The runbook in this repository an absolute runbook_url points at."""
    return ROOT / url.removeprefix(RUNBOOK_BASE)
RULE_TESTS = sorted((ROOT / "alerts" / "tests").glob("*.yml"))
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
# vLLM 0.33's metric families (name, kind), as the simulator exports them.
VLLM_METRICS = ROOT / "enginesim" / "data" / "vllm-metrics.tsv"
# Every engine's own series start with its adapter's prefix (vllm:, sglang:).
ENGINE_PREFIXES = tuple(a.metric_prefix for a in ADAPTERS.values())

# Recording rules no alert reads, kept for the dashboards (the names are their interface) and for the live
# tests; every other recording rule must be read by an alert, directly or through another rule.
FOR_DASHBOARDS = frozenset({
    *(f"model_engine:{sli}_seconds:{q}_{w}" for sli in ("ttft", "itl", "e2e") for q in ("p50", "p95", "p99")
      for w in ("1m", "5m")),
    "model_engine:generation_tokens:rate1m",
    "model_engine:request_error_ratio:1m",
    "model:pitstop_replicas_ready:ratio",
    "node_gpu:pitstop_gpu_thermal_headroom_celsius",
})

# The latency histograms' default bucket bounds of each engine, by the SLO's signal (ttft, itl): an SLO's miss
# ratio reads the bucket at its threshold, which only exists where the threshold is a bound. The simulator
# declares each engine's:
# - vLLM: fixed in its code; vLLM 0.33's (enginesim/metrics.py).
# - SGLang: set by --bucket-time-to-first-token and --bucket-inter-token-latency; without them the defaults of its
#   TokenizerMetricsCollector (python/sglang/srt/metrics/collector.py), as SGLang 0.5.23 renders them
#   (enginesim/sglang.py, checked against tests/fixtures/sglang-0.5.23/metrics.txt).
DEFAULT_BUCKETS: dict[tuple[str, str], tuple[float, ...]] = {
    (VLLM.name, "ttft"): TTFT_BUCKETS,
    (VLLM.name, "itl"): ITL_BUCKETS,
    (SGLANG.name, "ttft"): sglang_sim.TTFT_BUCKETS,
    (SGLANG.name, "itl"): sglang_sim.ITL_BUCKETS,
}
# The flag that sets an engine's bounds, by signal; an engine without one (vLLM) cannot be given a bound.
BUCKET_FLAGS: dict[tuple[str, str], str] = {
    (SGLANG.name, "ttft"): "--bucket-time-to-first-token",
    (SGLANG.name, "itl"): "--bucket-inter-token-latency",
}

# PromQL identifiers; string literals are removed first so label values never count as series.
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_RANGE = re.compile(r"\[[^\]]*\]")


def load_rules(path: Path = RULES) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def all_rules(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for group in data["groups"]:
        yield from group["rules"]


def alerts(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in all_rules(data) if "alert" in r]


def recorded_names(data: dict[str, Any]) -> set[str]:
    return {r["record"] for r in all_rules(data) if "record" in r}


def pitstop_series(expr: str) -> set[str]:
    """Every identifier in ``expr`` that names a Pitstop series or a Pitstop recording rule."""
    bare = _RANGE.sub("", _STRING.sub('""', expr))
    return {name for name in _IDENT.findall(bare) if "pitstop_" in name}


# A recording rule's name: level:metric:operations.
_RECORDED = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def referenced_series(expr: str) -> set[str]:
    """Every identifier in ``expr`` that names a Pitstop series, an engine's series or a recording rule."""
    bare = _RANGE.sub("", _STRING.sub('""', expr))
    return {name for name in _IDENT.findall(bare)
            if "pitstop_" in name or name.startswith(ENGINE_PREFIXES) or _RECORDED.match(name)}


def engine_series_in(expr: str) -> set[str]:
    """The engines' own series (vllm:*, sglang:*) that ``expr`` reads."""
    return {name for name in referenced_series(expr) if name.startswith(ENGINE_PREFIXES)}


def engine_series(path: Path = VLLM_METRICS) -> set[str]:
    """Sample names of the engines' metric families: vLLM's list, and every name of each adapter's table
    (older names included). Counters with _total, histograms with _bucket, _count and _sum."""
    names: set[str] = set()
    for line in path.read_text().splitlines():
        if line.startswith("#") or line.startswith("name\t") or not line.strip():
            continue
        name, kind = line.split("\t")[:2]
        names |= {name + suffix for suffix in _SUFFIXES.get(kind, ("",))}
    for adapter in ADAPTERS.values():
        for metric in adapter.metrics:
            suffixes = _SUFFIXES["histogram"] if metric.kind == "histogram" else ("",)
            names |= {name + suffix for name in metric.names for suffix in suffixes}
    return names


# A header line of the rules naming an engine's bucket flag for a threshold that is none of its default bounds:
# "#   sglang ttft 0.5 s: --bucket-time-to-first-token 0.1 0.2 0.4 0.5 ...".
_BUCKET_FLAG = re.compile(r"^#\s+(\w+) (\w+) ([0-9.]+) s: (--[a-z-]+)((?: [0-9.]+)+)$")


def listed_bucket_flags(path: Path = RULES) -> dict[tuple[str, str, float], tuple[str, tuple[float, ...]]]:
    """(engine, signal, threshold) -> (flag, bounds) for every bucket flag the rules' header lists."""
    found = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        match = _BUCKET_FLAG.match(line)
        if match:
            engine, signal, threshold, flag, bounds = match.groups()
            found[(engine, signal, float(threshold))] = (flag, tuple(float(b) for b in bounds.split()))
    return found


def label_matchers(expr: str, label: str) -> list[tuple[str, str]]:
    """(operator, value) of every matcher of ``label`` in ``expr``: ``le="0.5"`` gives ("=", "0.5")."""
    return re.findall(rf'\b{re.escape(label)}\s*(=~|!~|!=|=)\s*"([^"]*)"', expr)


def expected_alerts(paths: list[Path] = RULE_TESTS) -> list[tuple[str, dict[str, str]]]:
    """(alertname, labels) of every alert some promtool test expects to fire."""
    found: list[tuple[str, dict[str, str]]] = []
    for path in paths:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                for alert in case.get("exp_alerts") or []:
                    labels = {str(k): str(v) for k, v in (alert.get("exp_labels") or {}).items()}
                    found.append((case["alertname"], labels))
    return found


def promql_test_exprs(paths: list[Path] = RULE_TESTS) -> list[str]:
    """The expressions of every promtool ``promql_expr_test``."""
    return [case["expr"] for path in paths for test in yaml.safe_load(path.read_text())["tests"]
            for case in test.get("promql_expr_test", [])]


def alerts_expected_to_fire(paths: list[Path] = RULE_TESTS) -> set[str]:
    """Alert names that some promtool test expects to fire."""
    names: set[str] = set()
    for path in paths:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                if case.get("exp_alerts"):
                    names.add(case["alertname"])
    return names


def exported_series() -> set[str]:
    """Sample names the agent and the control plane expose, read from their own collectors."""
    now = datetime.now(UTC)
    engine = EngineSample(**{name: 1.0 for name, f in EngineSample.model_fields.items()
                             if f.annotation in (float | None,)}, stalled=True)
    replica = ReplicaStatus(
        name="r0", model="m", url="http://127.0.0.1:1", state=ReplicaState.READY, ready=True, state_since=now,
        engine=engine, process=ProcessSample(pid=1, rss_bytes=1, num_processes=1, gpu_memory_bytes=1),
        canary_ttft_seconds=0.1, canary_ok=True,
    )
    gpu = GpuSample(index=0, uuid="GPU-0", name="gpu", temperature_celsius=50, slowdown_temperature_celsius=89,
                    memory_used_bytes=1, memory_total_bytes=2, utilization_ratio=0.5, power_watts=100,
                    power_limit_watts=700, ecc_uncorrected_total=0, xid_events_total=0)
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: ExportState(node="n", gpus=[gpu], replicas=[replica])))
    names = _sample_names(registry)
    telemetry = Telemetry()
    # The families read from the store on each scrape (nodes, actions, the outbox), served as the app does.
    telemetry.serve_store(lambda: StoreReading(nodes={}, actions={}, notifications_pending=0,
                                               notification_oldest_pending_seconds=0.0))
    return names | _sample_names(telemetry.registry)


# Sample-name suffixes by family type: a labelled metric with no child yet has a family but no samples.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _sample_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ())}
    return names


def dashboard_exprs(path: Path) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, rows included."""
    board = json.loads(path.read_text())
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((panel.get("title", "?"), target["expr"]))
            walk(panel.get("panels", []))

    walk(board.get("panels", []))
    return found


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
# What Grafana's Prometheus data source escapes in a value of a multi-value or "All" variable inside =~ regexes.
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


def _grafana_regex_value(value: str | Sequence[str]) -> str:
    """A variable's value as Grafana writes it into PromQL: ``.*`` (All) as is, a value regex-escaped (with
    the backslash doubled for the double-quoted PromQL string), several as ``(a|b)``."""
    if isinstance(value, str):
        if value == ".*":
            return value
        return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(), value.replace("\\", "\\\\\\\\"))
    escaped = [_grafana_regex_value(v) for v in value]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, values: Mapping[str, str | Sequence[str]], *, rate_interval: str = "1m",
               interval: str = "15s", range_: str = "1h") -> str:
    """``expr`` with its template variables replaced as Grafana would before sending it to Prometheus.

    ``values`` maps a variable (``node``) to its value: one value (``"node-a"``), several (``["a", "b"]``,
    written ``(a|b)``) or ``".*"``, the dashboards' "All". ``$var``, ``${var}`` and ``${var:format}`` are
    replaced; ``$__rate_interval``, ``$__interval`` and ``$__range`` become ``rate_interval``, ``interval`` and
    ``range_``. A variable missing from ``values`` raises KeyError (a query Grafana could not run either).
    """
    builtins = {"__rate_interval": rate_interval, "__interval": interval, "__range": range_}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        if name not in values:
            raise KeyError(f"no value for the template variable ${name} in {expr!r}")
        return _grafana_regex_value(values[name])

    return _VARIABLE.sub(value, expr)


def dashboard_variable_exprs(path: Path) -> list[str]:
    board = json.loads(path.read_text())
    out = []
    for var in board.get("templating", {}).get("list", []):
        query = var.get("query")
        if var.get("type") == "query":
            out.append(query["query"] if isinstance(query, dict) else query)
    return out


def concrete(expr: str) -> str:
    """A dashboard expr with Grafana's variables replaced so Prometheus can run it."""
    for name, value in (("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", "1h")):
        expr = expr.replace(name, value)
    return re.sub(r"\$\{?(node|engine|model|replica|gpu)\}?", ".*", expr)
