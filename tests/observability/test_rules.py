"""The alert rules: promtool accepts and tests them, every alert is complete, tested, and names real series, and
the SLO numbers are the shipped policies'."""

from __future__ import annotations

import copy
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from controlplane.policy.conditions import ErrorRateCondition, ThresholdCondition
from controlplane.policy_files import load_directory
from engines import ADAPTERS, EngineAdapter
from tests.observability.rules import (
    BUCKET_FLAGS,
    DASHBOARDS,
    DEFAULT_BUCKETS,
    ENGINE_PREFIXES,
    FOR_DASHBOARDS,
    ROOT,
    RULE_TESTS,
    RULES,
    RUNBOOK_BASE,
    alerts,
    all_rules,
    dashboard_exprs,
    engine_series,
    engine_series_in,
    expected_alerts,
    exported_series,
    label_matchers,
    listed_bucket_flags,
    load_rules,
    promql_test_exprs,
    recorded_names,
    referenced_series,
    runbook_file,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian package prometheus)")

# What the brief of the rules promises to cover, by alert name.
REQUIRED = {
    "ReplicaDown", "ReplicaCrashLoop", "EngineStalled", "CanaryFailing", "TTFTSLOBreach", "ITLSLOBreach",
    "HighErrorRate", "TTFTSLOBurnRate", "ITLSLOBurnRate", "ErrorBudgetBurnRate", "KVCacheSaturated", "GPUHot",
    "GPUThrottled", "GPUXidErrors", "GPUEccErrors", "GPUMemoryHigh", "HostRSSLeak", "EngineScrapeErrors",
    "AgentDown", "EngineMetricsDown", "ScrapeJobMissing", "ControlPlaneNoReports", "ControlPlaneStaleNodes",
    "ControlPlaneDown",
}
# The scrape jobs of alerts/README.md: each has an up-based alert and an absent(up) alert.
JOBS = {"pitstop-agent": "AgentDown", "pitstop-engines": "EngineMetricsDown",
        "pitstop-controlplane": "ControlPlaneDown"}
# Alerts about the whole fleet or its scrape config, with no node, GPU, replica or model to keep.
FLEET_WIDE = {"ScrapeJobMissing"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    # promtool evaluates every rule at every step of each test group: seconds of CPU that a busy machine stretches
    # (over 60 s seen beside other tests). The test's own limit (pytest-timeout) bounds a hang.
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=ROOT)


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = _promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize(("right", "wrong", "test_file", "named"), [
    # The TTFT objective moved from 500 ms to 1 s.
    ("model_engine:ttft_seconds:p99_5m > 0.5", "model_engine:ttft_seconds:p99_5m > 1", "slo.yml", "TTFTSLOBreach"),
    # A budget of 10 % instead of 1 %.
    ("model_engine:ttft_slo_miss:ratio_rate1h / 0.01", "model_engine:ttft_slo_miss:ratio_rate1h / 0.1",
     "burn.yml", "TTFTSLOBurnRate"),
    # The miss ratio read at another bucket.
    ('le="0.5"', 'le="1.0"', "burn.yml", "TTFTSLOBurnRate"),
    # The agent's aborted canaries counted as users' errors again.
    ("- (sum by (model, engine) (rate(pitstop_canary_aborts_total[5m]))", "- (0 * sum by (model, engine) "
     "(rate(pitstop_canary_aborts_total[5m]))", "slo.yml", "HighErrorRate"),
    # SGLang's tensor-parallel copies of one batch counted once per rank.
    ("max without (moe_ep_rank, pp_rank, tp_rank)", "sum without (moe_ep_rank, pp_rank, tp_rank)", "slo.yml",
     "tensor-parallel cop"),
    ("max without (moe_ep_rank, pp_rank, tp_rank)", "sum without (moe_ep_rank, pp_rank, tp_rank)", "burn.yml",
     "tensor-parallel cop"),
    # An SGLang model without an abort yet: no error ratio instead of 0.
    ("(model_engine:request_errors:rate5m or on (model, engine) 0 * model_engine:requests:rate5m)",
     "model_engine:request_errors:rate5m", "slo.yml", "model_engine:request_error_ratio:5m"),
    # Every throttle reason counted, the power cap included.
    ('pitstop_gpu_throttle_reason{fault="true"}', "pitstop_gpu_throttle_reason", "gpus.yml", "GPUThrottled"),
])
def test_promtool_unit_tests_catch_a_wrong_rule(tmp_path: Path, right: str, wrong: str, test_file: str,
                                                named: str) -> None:
    # The unit tests are not vacuous: each of these changes makes them fail, naming the alert, the expression
    # or the test (promtool stops a test at its first failed check).
    text = RULES.read_text()
    assert right in text
    (tmp_path / "tests").mkdir()
    (tmp_path / "pitstop-rules.yml").write_text(text.replace(right, wrong))
    copied = tmp_path / "tests" / test_file
    copied.write_text((ROOT / "alerts" / "tests" / test_file).read_text())
    result = _promtool("test", "rules", str(copied))
    assert result.returncode != 0
    assert named in result.stdout + result.stderr


def test_every_required_alert_exists_and_every_rule_of_it_is_unit_tested() -> None:
    rules = alerts(load_rules())
    names = {a["alert"] for a in rules}
    assert names >= REQUIRED, REQUIRED - names
    expected = expected_alerts()
    # Each rule, not only each name: the fast and the slow burn, the absent alert of each job.
    untested = []
    for rule in rules:
        static = {k: str(v) for k, v in rule.get("labels", {}).items()}
        if not any(name == rule["alert"] and labels.items() >= static.items() for name, labels in expected):
            untested.append(f"{rule['alert']} {static}")
    assert untested == [], f"alert rules without a firing promtool test: {untested}"


def test_every_alert_has_for_severity_evidence_and_a_runbook_file() -> None:
    problems = []
    for rule in alerts(load_rules()):
        name = rule["alert"]
        annotations = rule.get("annotations", {})
        if "for" not in rule:
            problems.append(f"{name}: no for:")
        if rule.get("labels", {}).get("severity") not in ("page", "warning", "info"):
            problems.append(f"{name}: severity must be page, warning or info")
        if not annotations.get("summary") or not annotations.get("description"):
            problems.append(f"{name}: summary and description required")
        text = annotations.get("summary", "") + annotations.get("description", "")
        if "$value" not in text and "$labels" not in text:
            problems.append(f"{name}: annotations carry no evidence")
        if annotations.get("runbook_url") != f"{RUNBOOK_BASE}runbooks/alerts/{name}.md":
            problems.append(f"{name}: runbook_url should be {RUNBOOK_BASE}runbooks/alerts/{name}.md")
        elif not runbook_file(annotations["runbook_url"]).is_file():
            problems.append(f"{name}: runbook {annotations['runbook_url']} missing")
    assert problems == []


def test_every_runbook_belongs_to_an_alert_and_the_index_lists_it() -> None:
    names = {a["alert"] for a in alerts(load_rules())}
    folder = ROOT / "runbooks" / "alerts"
    pages = {p.stem for p in folder.glob("*.md")} - {"README"}
    assert pages == names
    index = (folder / "README.md").read_text()
    assert {n for n in names if f"]({n}.md)" not in index} == set()
    # Links to the remediation policies' pages resolve.
    for page in folder.glob("*.md"):
        for target in re.findall(r"\]\((\.\./[^)#]+\.md)", page.read_text()):
            assert (folder / target).resolve().is_file(), f"{page.name}: broken link {target}"


def test_every_scrape_job_has_an_up_alert_and_an_absent_alert() -> None:
    rules = alerts(load_rules())
    for job, up_alert in JOBS.items():
        (rule,) = [r for r in rules if r["alert"] == up_alert]
        assert f'up{{job="{job}"}} == 0' in rule["expr"]
        absent = [r for r in rules if f'absent(up{{job="{job}"}})' in r["expr"]]
        assert len(absent) == 1, job
        assert absent[0]["alert"] == "ScrapeJobMissing" and absent[0]["labels"]["job"] == job


def test_alerts_keep_the_labels_that_locate_the_problem() -> None:
    # Aggregations name what they keep (sum by (node, gpu) ...): an aggregation to nothing would drop node, gpu,
    # replica and model, which Alertmanager groups and inhibits by.
    bare = re.compile(r"\b(sum|min|max|avg|count|group|stddev|stdvar)\s*\(")
    offenders = [r["alert"] for r in alerts(load_rules()) if r["alert"] not in FLEET_WIDE and bare.search(r["expr"])]
    assert offenders == []


def test_every_recording_rule_is_unit_tested_and_read_by_an_alert_or_a_dashboard() -> None:
    data = load_rules()
    recorded = recorded_names(data)
    by_name: dict[str, set[str]] = {}
    for rule in all_rules(data):
        if "record" in rule:
            by_name.setdefault(rule["record"], set()).update(referenced_series(rule["expr"]) & recorded)
    # Exercised by a promql_expr_test directly, or through a tested rule that reads it (the first layer's rates
    # through the quantiles and ratios made of them).
    tested: set[str] = set()
    todo = set().union(*(referenced_series(e) for e in promql_test_exprs())) & recorded
    while todo:
        name = todo.pop()
        tested.add(name)
        todo |= by_name[name] - tested
    assert recorded - tested == set(), f"recording rules no promql_expr_test exercises: {recorded - tested}"
    # What the alerts read, directly or through other recording rules.
    used: set[str] = set()
    todo = set().union(*(referenced_series(a["expr"]) for a in alerts(data))) & recorded
    todo |= FOR_DASHBOARDS & recorded
    while todo:
        name = todo.pop()
        used.add(name)
        todo |= by_name[name] - used
    assert recorded - used == set(), "recording rules nothing reads"
    assert recorded >= FOR_DASHBOARDS, "FOR_DASHBOARDS names rules that do not exist"


def test_engine_series_are_read_from_the_engines_job() -> None:
    # Each selector of an engine's series names the job: another job scraping an engine directly (without the
    # fleet labels) would otherwise be summed in.
    prefixes = "|".join(re.escape(p) for p in ENGINE_PREFIXES)
    problems = []
    for rule in all_rules(load_rules()):
        for name, selector in re.findall(rf"((?:{prefixes})[A-Za-z0-9_:]+)(\{{[^}}]*\}})?", rule["expr"]):
            if 'job="pitstop-engines"' not in selector:
                problems.append(f"{rule.get('alert') or rule.get('record')}: {name}{selector}")
    assert problems == []


# The first layer: engine-neutral family (model_engine:<family>:rate<window>) -> the adapter's figures it reads
# (as the agent reads them: its errors are "errors" and, where the engine counts them apart, "server_errors"),
# and the suffix of their samples.
FIRST_LAYER: dict[str, tuple[tuple[str, ...], str]] = {
    "ttft_seconds_bucket": (("ttft",), "_bucket"), "itl_seconds_bucket": (("itl",), "_bucket"),
    "e2e_seconds_bucket": (("e2e",), "_bucket"), "ttft_seconds_count": (("ttft",), "_count"),
    "itl_seconds_count": (("itl",), "_count"), "ttft_slo_good": (("ttft",), "_bucket"),
    "itl_slo_good": (("itl",), "_bucket"), "requests": (("requests",), ""),
    "request_errors": (("errors", "server_errors"), ""), "generation_tokens": (("generation_tokens",), ""),
}
# Label values a filter of the rules must tell apart from the adapter's (HTTP statuses, finish reasons,
# endpoints, token modes): a regex matcher is checked on these and on the adapter's own values.
_PROBES = frozenset({*(str(code) for code in range(100, 600)), "", "stop", "length", "abort", "error",
                     "repetition", "/health", "/health_generate", "/v1/models", "/metrics", "/generate",
                     "/v1/completions", "/v1/chat/completions", "decode", "prefill_compute", "prefill_cache"})


def _selectors(expr: str, name: str) -> list[str]:
    """The matcher lists (``{...}``) of every selector of ``name`` in ``expr``."""
    return re.findall(rf"{re.escape(name)}(\{{[^}}]*\}})", expr)


def _filter_problems(expr: str, names: tuple[str, ...], filters: tuple[tuple[str, frozenset[str]], ...]) -> list[str]:
    """Where a selector of ``names`` does not keep exactly the samples the adapter's ``filters`` keep."""
    problems = []
    for name in names:
        for selector in _selectors(expr, name):
            for label, values in filters:
                matchers = label_matchers(selector, label)
                accepted = {v for v in _PROBES | values
                            if matchers and all(op in ("=", "=~") and re.fullmatch(value, v) for op, value in matchers)}
                if accepted != set(values):
                    problems.append(f"{name} {label} {matchers}, the adapter counts {sorted(values)}")
    return problems


_FIRST = re.compile(r"model_engine:(\w+):rate([0-9]+[mh])")


def _engine_of(series: set[str]) -> EngineAdapter | None:
    engines = {a.name for a in ADAPTERS.values() for name in series if name.startswith(a.metric_prefix)}
    return ADAPTERS[engines.pop()] if len(engines) == 1 else None


def first_layer_problems(data: dict[str, Any]) -> list[str]:
    """Where the rules that read the engines' own series stray from the adapters' tables (empty when none)."""
    problems: list[str] = []
    engines_of: dict[str, set[str]] = {}
    for rule in all_rules(data):
        name, expr = rule.get("record") or rule.get("alert"), rule["expr"]
        series = engine_series_in(expr)
        if not series:
            continue
        match = _FIRST.fullmatch(rule.get("record", ""))
        engine = _engine_of(series)
        if match is None or match.group(1) not in FIRST_LAYER or engine is None:
            problems.append(f"{name}: reads {sorted(series)}; only the first layer reads an engine's series, "
                            "one engine per rule")
            continue
        family, window = match.groups()
        keys, suffix = FIRST_LAYER[family]
        engines_of.setdefault(str(name), set()).add(engine.name)
        where = f"{name} ({engine.name})"
        metrics = [m for key in keys if (m := engine.metric(key)) is not None]
        want = {n + suffix for m in metrics for n in m.names}
        if series != want:
            problems.append(f"{where}: reads {sorted(series)}, the adapter's {'/'.join(keys)} is {sorted(want)}")
        if rule.get("labels") != {"engine": engine.name}:
            problems.append(f"{where}: labels {rule.get('labels')}, want engine: {engine.name}")
        grouping = {"le", "model", "engine"} if family.endswith("_bucket") else {"model", "engine"}
        if {label.strip() for label in re.findall(r"sum by \(([^)]*)\)", expr)[0].split(",")} != grouping:
            problems.append(f"{where}: want sum by ({', '.join(sorted(grouping))})")
        if set(re.findall(r"\[([0-9]+[mh])\]", expr)) != {window}:
            problems.append(f"{where}: rates over other windows than {window}")
        if engine.copy_labels and f"max without ({', '.join(sorted(engine.copy_labels))})" not in expr:
            problems.append(f"{where}: the copies ({', '.join(sorted(engine.copy_labels))}) are not counted once")
        for metric in metrics:
            problems += [f"{where}: {p}" for p in _filter_problems(expr, metric.names, metric.filters)]
    for name, engines in sorted(engines_of.items()):
        if engines != set(ADAPTERS):
            problems.append(f"{name}: recorded for {sorted(engines)}, want every engine {sorted(ADAPTERS)}")
    return problems


def test_the_first_layer_reads_each_engine_by_its_adapters_names_and_nothing_else_reads_an_engine() -> None:
    assert first_layer_problems(load_rules()) == []


def test_the_first_layer_check_notices_a_rule_that_strays() -> None:
    shipped = load_rules()
    for old, new, expect in [
        ("max without (moe_ep_rank, pp_rank, tp_rank)", "sum without (moe_ep_rank, pp_rank, tp_rank)",
         "are not counted once"),
        ("or rate(sglang:http_responses_total", "or rate(sglang:http_answers_total",
         "the adapter's errors/server_errors"),
        ('finished_reason=~"error|abort"', 'finished_reason=~"error"', "the adapter counts"),
        ('status_code=~"5.."', 'status_code=~"5..|429"', "the adapter counts"),
        ('mode="decode"', 'mode=~"decode|prefill_compute"', "the adapter counts"),
    ]:
        data = copy.deepcopy(shipped)
        rule = next(r for r in all_rules(data) if old in r["expr"])
        rule["expr"] = rule["expr"].replace(old, new)
        assert any(expect in p for p in first_layer_problems(data)), (old, first_layer_problems(data))
    # An alert reading an engine's series itself.
    data = copy.deepcopy(shipped)
    breach = next(r for r in alerts(data) if r["alert"] == "TTFTSLOBreach")
    breach["expr"] = ("histogram_quantile(0.99, sum by (le, model) (rate("
                      'vllm:time_to_first_token_seconds_bucket{job="pitstop-engines"}[5m]))) > 0.5')
    assert any("only the first layer reads" in p for p in first_layer_problems(data))
    # An engine left out of a first-layer name.
    data = copy.deepcopy(shipped)
    for group in data["groups"]:
        group["rules"] = [r for r in group["rules"] if not (r.get("record") == "model_engine:requests:rate5m"
                                                             and r.get("labels") == {"engine": "sglang"})]
    assert any("model_engine:requests:rate5m: recorded for ['vllm']" in p for p in first_layer_problems(data))


def test_rules_and_dashboards_name_only_exported_series() -> None:
    data = load_rules()
    known = exported_series() | engine_series() | recorded_names(data)
    unknown = {}
    for rule in all_rules(data):
        missing = referenced_series(rule["expr"]) - known
        if missing:
            unknown[rule.get("alert") or rule.get("record")] = missing
    for board in DASHBOARDS:
        for title, expr in dashboard_exprs(board):
            missing = referenced_series(expr) - known
            if missing:
                unknown[f"{board.name}: {title}"] = missing
    assert unknown == {}


def test_the_series_check_notices_a_misspelt_name() -> None:
    known = exported_series() | engine_series() | recorded_names(load_rules())
    assert referenced_series('increase(pitstop_gpu_xid_events_total{node="a"}[5m])') <= known
    assert referenced_series("pitstop_gpu_xid_total > 0") - known == {"pitstop_gpu_xid_total"}
    assert referenced_series('rate(vllm:time_to_first_token_seconds_bucket{le="0.5"}[5m])') <= known
    assert referenced_series("rate(vllm:time_to_first_token_bucket[5m])") - known == {
        "vllm:time_to_first_token_bucket"}
    assert referenced_series("rate(sglang:num_aborted_requests_total[5m])") <= known
    assert referenced_series("rate(sglang:num_aborted_total[5m])") - known == {"sglang:num_aborted_total"}
    assert referenced_series("model_engine:ttft_seconds:p99_5m > 0.5") <= known
    assert referenced_series("model_engine:ttft_seconds:p99_10m > 0.5") - known == {
        "model_engine:ttft_seconds:p99_10m"}


# --- One source of SLO targets: the shipped policies -------------------------------------------------------

# Burn-rate variants (Google SRE workbook): windows, factor, severity.
BURNS = {"fast": ({"1h", "5m"}, 14.4, "page"), "slow": ({"6h", "30m"}, 6.0, "warning")}
# Latency SLOs: policy -> (signal, breach alert, burn-rate alert).
LATENCY_SLOS = {
    "ttft-slo": ("ttft", "TTFTSLOBreach", "TTFTSLOBurnRate"),
    "itl-slo": ("itl", "ITLSLOBreach", "ITLSLOBurnRate"),
}
MISS_WINDOWS = ("5m", "30m", "1h", "6h")
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)


def _burn_problems(rules: list[dict[str, Any]], name: str, budget: float) -> list[str]:
    """The burn-rate alerts ``name`` divide by ``budget`` and compare with their variant's factor and windows."""
    problems = []
    variants = {r.get("labels", {}).get("burn"): r for r in rules if r["alert"] == name}
    if set(variants) != set(BURNS):
        return [f"{name}: variants {sorted(map(str, variants))}, want fast and slow"]
    for burn, (windows, factor, severity) in BURNS.items():
        rule = variants[burn]
        pairs = re.findall(rf":(?:ratio_rate)?([0-9]+[mh]) / {_NUMBER} > {_NUMBER}", rule["expr"])
        if {w for w, _, _ in pairs} != windows:
            problems.append(f"{name} {burn}: windows {sorted(w for w, _, _ in pairs)}, want {sorted(windows)}")
        for window, divisor, compared in pairs:
            if not _same(float(divisor), budget):
                problems.append(f"{name} {burn} {window}: budget {divisor}, the policy's is {budget:g}")
            if not _same(float(compared), factor):
                problems.append(f"{name} {burn} {window}: factor {compared}, want {factor:g}")
        if rule["labels"]["severity"] != severity:
            problems.append(f"{name} {burn}: severity {rule['labels']['severity']}, want {severity}")
    return problems


def _latency_targets() -> dict[str, tuple[float, float]]:
    """Signal (ttft, itl) -> (quantile, threshold in seconds) of the shipped latency policies."""
    policies = {p.name: p for p in load_directory()}
    targets = {}
    for policy_name, (sli, _, _) in LATENCY_SLOS.items():
        condition = policies[policy_name].condition
        assert isinstance(condition, ThresholdCondition) and condition.op in (">", ">=")
        signal = re.fullmatch(rf"{sli}_p([0-9]+)_seconds", condition.signal)
        assert signal is not None, condition.signal
        targets[sli] = (int(signal.group(1)) / 100, condition.threshold)
    return targets


def slo_problems(data: dict[str, Any]) -> list[str]:
    """Every place where a rule's SLO number disagrees with the shipped policies (empty when they agree)."""
    policies = {p.name: p for p in load_directory()}
    rules = alerts(data)
    problems: list[str] = []
    for sli, (quantile, threshold) in _latency_targets().items():
        _, breach, burn = next(v for v in LATENCY_SLOS.values() if v[0] == sli)
        # The miss ratio reads each engine's bucket at the threshold (the good share), over each window.
        goods = [r for r in all_rules(data) if r.get("record", "").startswith(f"model_engine:{sli}_slo_good:")]
        if len(goods) != len(MISS_WINDOWS) * len(ADAPTERS):
            problems.append(f"{sli}: {len(goods)} good-share rules, want {MISS_WINDOWS} for each engine")
        for rule in goods:
            # One matcher per sample name read (the current one, and an older one where the adapter has it).
            les = [float(v) for _, v in label_matchers(rule["expr"], "le")]
            if not les or set(les) != {threshold}:
                problems.append(f"{rule['record']} ({rule.get('labels', {}).get('engine')}): le {les}, the "
                                f"policy's threshold is {threshold}")
        misses = {r["record"]: r["expr"].strip() for r in all_rules(data)
                  if r.get("record", "").startswith(f"model_engine:{sli}_slo_miss:")}
        want = {f"model_engine:{sli}_slo_miss:ratio_rate{w}":
                f"1 - model_engine:{sli}_slo_good:rate{w} / model_engine:{sli}_seconds_count:rate{w}"
                for w in MISS_WINDOWS}
        if misses != want:
            problems.append(f"{sli}: miss ratios {misses}, want 1 - good / count over {MISS_WINDOWS}")
        breaches = [r for r in rules if r["alert"] == breach]
        compared = [re.fullmatch(rf"model_engine:{sli}_seconds:p([0-9]+)_5m > {_NUMBER}", r["expr"].strip())
                    for r in breaches]
        if not breaches or None in compared:
            problems.append(f"{breach}: want model_engine:{sli}_seconds:p<q>_5m > <threshold>")
        for match in filter(None, compared):
            if int(match.group(1)) / 100 != quantile or not _same(float(match.group(2)), threshold):
                problems.append(f"{breach}: p{match.group(1)} > {match.group(2)}, the policy's is "
                                f"p{round(quantile * 100)} > {threshold}")
        problems += _burn_problems(rules, burn, budget=round(1 - quantile, 9))
    condition = policies["error-rate"].condition
    assert isinstance(condition, ErrorRateCondition)
    for rule in [r for r in rules if r["alert"] in ("HighErrorRate", "ErrorBudgetBurnRate")]:
        floors = re.findall(rf"model_engine:requests:rate5m >= {_NUMBER}", rule["expr"])
        if [float(f) for f in floors] != [condition.min_requests_per_second]:
            problems.append(f"{rule['alert']}: minimum traffic {floors}, the policy's is "
                            f"{condition.min_requests_per_second}")
    high = [re.search(rf"model_engine:request_error_ratio:5m > {_NUMBER}", r["expr"])
            for r in rules if r["alert"] == "HighErrorRate"]
    if not high or None in high:
        problems.append("HighErrorRate: want model_engine:request_error_ratio:5m > <threshold>")
    for match in filter(None, high):
        if not _same(float(match.group(1)), condition.threshold):
            problems.append(f"HighErrorRate: > {match.group(1)}, the policy's threshold is {condition.threshold}")
    problems += _burn_problems(rules, "ErrorBudgetBurnRate", budget=condition.threshold)
    return problems


def test_slo_rules_agree_with_the_shipped_policies() -> None:
    assert slo_problems(load_rules()) == []


def test_the_slo_check_notices_a_rule_that_drifted_from_its_policy() -> None:
    shipped = load_rules()
    for old, new, expect in [
        ('le="0.5"', 'le="0.25"', "model_engine:ttft_slo_good:rate5m (vllm): le [0.25]"),
        ("model_engine:itl_seconds:p99_5m > 0.2", "model_engine:itl_seconds:p99_5m > 0.3", "ITLSLOBreach"),
        ("1 - model_engine:itl_slo_good:rate1h", "1 - model_engine:itl_slo_good:rate6h", "itl: miss ratios"),
        ("ratio_rate6h / 0.01 > 6", "ratio_rate6h / 0.05 > 6", "budget 0.05"),
        ("model_engine:request_error_ratio:5m > 0.001", "model_engine:request_error_ratio:5m > 0.01",
         "HighErrorRate"),
        ("model_engine:request_error_ratio:1h / 0.001", "model_engine:request_error_ratio:1h / 0.01",
         "ErrorBudgetBurnRate fast 1h: budget 0.01"),
    ]:
        data = copy.deepcopy(shipped)
        hits = 0
        for rule in all_rules(data):
            if old in rule["expr"]:
                rule["expr"] = rule["expr"].replace(old, new, 1)
                hits += 1
                break
        assert hits == 1, old
        found = slo_problems(data)
        assert any(expect in p for p in found), (old, found)


# --- Every engine has a bucket at every latency threshold ------------------------------------------------


def bucket_problems(thresholds: dict[str, float],
                    listed: dict[tuple[str, str, float], tuple[str, tuple[float, ...]]]) -> list[str]:
    """Each engine and signal whose SLO threshold has no bucket: neither a bound of the engine's default buckets
    nor listed in the rules' header with the engine's bucket flag, its bounds including the threshold."""
    problems = []
    for engine in ADAPTERS:
        for sli, threshold in thresholds.items():
            entry = listed.get((engine, sli, threshold))
            if any(_same(threshold, bound) for bound in DEFAULT_BUCKETS[(engine, sli)]):
                if entry is not None:
                    problems.append(f"{engine} {sli}: {threshold:g} s is a default bound; drop its bucket-flag line")
                continue
            if entry is None:
                problems.append(f"{engine} {sli}: {threshold:g} s is no bound of the default buckets, and the rules' "
                                "header lists no bucket flag for it: the miss ratio would silently be absent")
                continue
            flag, bounds = entry
            if flag != BUCKET_FLAGS.get((engine, sli)):
                problems.append(f"{engine} {sli}: {flag} is not the engine's bucket flag "
                                f"({BUCKET_FLAGS.get((engine, sli), 'it has none')})")
            if not any(_same(threshold, bound) for bound in bounds):
                problems.append(f"{engine} {sli}: the bounds listed for {flag} lack {threshold:g}")
    for engine, sli, threshold in listed:
        if sli not in thresholds or not _same(thresholds[sli], threshold):
            problems.append(f"{engine} {sli}: a bucket flag for {threshold:g} s, which is no SLO threshold")
    return problems


def test_every_latency_threshold_is_a_bucket_bound_of_every_engine_or_needs_its_flag() -> None:
    thresholds = {sli: threshold for sli, (_, threshold) in _latency_targets().items()}
    listed = listed_bucket_flags()
    assert bucket_problems(thresholds, listed) == []
    # What the header lists, alerts/README.md tells operators, flag and bounds as written.
    readme = (ROOT / "alerts" / "README.md").read_text()
    for flag, bounds in listed.values():
        assert f"{flag} {' '.join(f'{b:g}' for b in bounds)}" in readme, flag
    # The default buckets and flags declared here agree with the adapters' lowest TTFT bound and TTFT flag.
    assert {a.name: a.lowest_ttft_bucket for a in ADAPTERS.values()} == {
        a.name: min(DEFAULT_BUCKETS[(a.name, "ttft")]) for a in ADAPTERS.values()}
    assert {a.name: a.ttft_buckets_flag for a in ADAPTERS.values()} == {
        a.name: BUCKET_FLAGS.get((a.name, "ttft")) for a in ADAPTERS.values()}


def test_the_bucket_check_fails_when_a_threshold_silently_has_no_bucket() -> None:
    listed = listed_bucket_flags()
    assert any("sglang ttft: 0.5 s is no bound" in p for p in bucket_problems({"ttft": 0.5, "itl": 0.2}, {}))
    # A threshold no engine has a bound for: vLLM has no flag to give it one.
    found = bucket_problems({"ttft": 0.5, "itl": 0.25}, listed)
    assert any(p.startswith("vllm itl: 0.25 s is no bound") for p in found)
    assert any(p.startswith("sglang itl: 0.25 s is no bound") for p in found)
    # A listed line that is no longer needed, or names a flag the engine does not have.
    assert any("drop its bucket-flag line" in p
               for p in bucket_problems({"ttft": 0.4, "itl": 0.2}, {("sglang", "ttft", 0.4): ("--x", (0.4,))}))
    assert any("it has none" in p
               for p in bucket_problems({"ttft": 0.3, "itl": 0.2}, {("vllm", "ttft", 0.3): ("--x", (0.3,))}))
