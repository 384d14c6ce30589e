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

from agent.engine_metrics import ENGINE_METRICS
from controlplane.policy.conditions import ErrorRateCondition, ThresholdCondition
from controlplane.policy_files import load_directory
from enginesim.metrics import ITL_BUCKETS, TTFT_BUCKETS
from tests.observability.rules import (
    DASHBOARDS,
    FOR_DASHBOARDS,
    ROOT,
    RULE_TESTS,
    RULES,
    RUNBOOK_BASE,
    alerts,
    all_rules,
    dashboard_exprs,
    expected_alerts,
    exported_series,
    label_matchers,
    load_rules,
    promql_test_exprs,
    recorded_names,
    referenced_series,
    runbook_file,
    vllm_series,
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
@pytest.mark.parametrize(("right", "wrong", "test_file", "alertname"), [
    # The TTFT objective moved from 500 ms to 1 s.
    ("model:vllm_ttft_seconds:p99_5m > 0.5", "model:vllm_ttft_seconds:p99_5m > 1", "slo.yml", "TTFTSLOBreach"),
    # A budget of 10 % instead of 1 %.
    ("model:vllm_ttft_slo_miss:ratio_rate1h / 0.01", "model:vllm_ttft_slo_miss:ratio_rate1h / 0.1", "burn.yml",
     "TTFTSLOBurnRate"),
    # The miss ratio read at another bucket.
    ('le="0.5"', 'le="1.0"', "burn.yml", "TTFTSLOBurnRate"),
    # The agent's aborted canaries counted as users' errors again.
    ("- (sum by (model) (rate(pitstop_canary_aborts_total[5m]))", "- (0 * sum by (model) "
     "(rate(pitstop_canary_aborts_total[5m]))", "slo.yml", "HighErrorRate"),
    # Every throttle reason counted, the power cap included.
    ('pitstop_gpu_throttle_reason{fault="true"}', "pitstop_gpu_throttle_reason", "gpus.yml", "GPUThrottled"),
])
def test_promtool_unit_tests_catch_a_wrong_rule(tmp_path: Path, right: str, wrong: str, test_file: str,
                                                alertname: str) -> None:
    # The unit tests are not vacuous: each of these changes makes them fail.
    text = RULES.read_text()
    assert right in text
    (tmp_path / "tests").mkdir()
    (tmp_path / "pitstop-rules.yml").write_text(text.replace(right, wrong))
    copied = tmp_path / "tests" / test_file
    copied.write_text((ROOT / "alerts" / "tests" / test_file).read_text())
    result = _promtool("test", "rules", str(copied))
    assert result.returncode != 0
    assert alertname in result.stdout + result.stderr


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
    exprs = promql_test_exprs()
    untested = {n for n in recorded if not any(n in referenced_series(e) for e in exprs)}
    assert untested == set(), f"recording rules without a promql_expr_test: {untested}"
    # What the alerts read, directly or through other recording rules.
    by_name = {r["record"]: r["expr"] for r in all_rules(data) if "record" in r}
    used: set[str] = set()
    todo = set().union(*(referenced_series(a["expr"]) for a in alerts(data))) & recorded
    while todo:
        name = todo.pop()
        used.add(name)
        todo |= (referenced_series(by_name[name]) & recorded) - used
    for name in FOR_DASHBOARDS & recorded:
        used |= referenced_series(by_name[name]) & recorded
    assert recorded - used - FOR_DASHBOARDS == set(), "recording rules nothing reads"
    assert recorded >= FOR_DASHBOARDS, "FOR_DASHBOARDS names rules that do not exist"


def test_vllm_series_are_read_from_the_engines_job() -> None:
    # Each vLLM selector names the job: another job scraping vLLM directly (without the fleet labels) would
    # otherwise be summed in.
    problems = []
    for rule in all_rules(load_rules()):
        for name, selector in re.findall(r"(vllm:[A-Za-z0-9_:]+)(\{[^}]*\})?", rule["expr"]):
            if 'job="pitstop-engines"' not in selector:
                problems.append(f"{rule.get('alert') or rule.get('record')}: {name}{selector}")
    assert problems == []


def test_rules_and_dashboards_name_only_exported_series() -> None:
    data = load_rules()
    known = exported_series() | vllm_series() | recorded_names(data)
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
    known = exported_series() | vllm_series() | recorded_names(load_rules())
    assert referenced_series('increase(pitstop_gpu_xid_events_total{node="a"}[5m])') <= known
    assert referenced_series("pitstop_gpu_xid_total > 0") - known == {"pitstop_gpu_xid_total"}
    assert referenced_series('rate(vllm:time_to_first_token_seconds_bucket{le="0.5"}[5m])') <= known
    assert referenced_series("rate(vllm:time_to_first_token_bucket[5m])") - known == {
        "vllm:time_to_first_token_bucket"}
    assert referenced_series("model:vllm_ttft_seconds:p99_5m > 0.5") <= known
    assert referenced_series("model:vllm_ttft_seconds:p99_10m > 0.5") - known == {"model:vllm_ttft_seconds:p99_10m"}


# --- One source of SLO targets: the shipped policies -------------------------------------------------------

# Burn-rate variants (Google SRE workbook): windows, factor, severity.
BURNS = {"fast": ({"1h", "5m"}, 14.4, "page"), "slow": ({"6h", "30m"}, 6.0, "warning")}
# Latency SLOs: policy -> (rule prefix, breach alert, burn-rate alert, vLLM's bucket boundaries).
LATENCY_SLOS = {
    "ttft-slo": ("ttft", "TTFTSLOBreach", "TTFTSLOBurnRate", TTFT_BUCKETS),
    "itl-slo": ("itl", "ITLSLOBreach", "ITLSLOBurnRate", ITL_BUCKETS),
}
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


def slo_problems(data: dict[str, Any]) -> list[str]:
    """Every place where a rule's SLO number disagrees with the shipped policies (empty when they agree)."""
    policies = {p.name: p for p in load_directory()}
    rules = alerts(data)
    problems: list[str] = []
    for policy_name, (sli, breach, burn, buckets) in LATENCY_SLOS.items():
        condition = policies[policy_name].condition
        assert isinstance(condition, ThresholdCondition) and condition.op in (">", ">=")
        signal = re.fullmatch(rf"{sli}_p([0-9]+)_seconds", condition.signal)
        assert signal is not None, condition.signal
        quantile, threshold = int(signal.group(1)) / 100, condition.threshold
        # The miss ratio reads the bucket at the threshold: it must be one of vLLM's boundaries.
        if threshold not in buckets:
            problems.append(f"{policy_name}: {threshold} s is no bucket boundary of vLLM's {sli} histogram")
        misses = [r for r in all_rules(data) if r.get("record", "").startswith(f"model:vllm_{sli}_slo_miss:")]
        if len(misses) != 4:
            problems.append(f"{sli}: {len(misses)} miss ratios, want 5m, 30m, 1h and 6h")
        for rule in misses:
            les = [float(v) for _, v in label_matchers(rule["expr"], "le")]
            if les != [threshold]:
                problems.append(f"{rule['record']}: le {les}, the policy's threshold is {threshold}")
        breaches = [r for r in rules if r["alert"] == breach]
        compared = [re.fullmatch(rf"model:vllm_{sli}_seconds:p([0-9]+)_5m > {_NUMBER}", r["expr"].strip())
                    for r in breaches]
        if not breaches or None in compared:
            problems.append(f"{breach}: want model:vllm_{sli}_seconds:p<q>_5m > <threshold>")
        for match in filter(None, compared):
            if int(match.group(1)) / 100 != quantile or not _same(float(match.group(2)), threshold):
                problems.append(f"{breach}: p{match.group(1)} > {match.group(2)}, the policy's is "
                                f"p{signal.group(1)} > {threshold}")
        problems += _burn_problems(rules, burn, budget=round(1 - quantile, 9))
    condition = policies["error-rate"].condition
    assert isinstance(condition, ErrorRateCondition)
    for rule in [r for r in rules if r["alert"] in ("HighErrorRate", "ErrorBudgetBurnRate")]:
        floors = re.findall(rf"model:vllm_requests:rate5m >= {_NUMBER}", rule["expr"])
        if [float(f) for f in floors] != [condition.min_requests_per_second]:
            problems.append(f"{rule['alert']}: minimum traffic {floors}, the policy's is "
                            f"{condition.min_requests_per_second}")
    high = [re.search(rf"model:vllm_request_error_ratio:5m > {_NUMBER}", r["expr"])
            for r in rules if r["alert"] == "HighErrorRate"]
    if not high or None in high:
        problems.append("HighErrorRate: want model:vllm_request_error_ratio:5m > <threshold>")
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
        ('le="0.5"', 'le="0.25"', "model:vllm_ttft_slo_miss:ratio_rate5m: le [0.25]"),
        ("model:vllm_itl_seconds:p99_5m > 0.2", "model:vllm_itl_seconds:p99_5m > 0.3", "ITLSLOBreach"),
        ("ratio_rate6h / 0.01 > 6", "ratio_rate6h / 0.05 > 6", "budget 0.05"),
        ("model:vllm_request_error_ratio:5m > 0.001", "model:vllm_request_error_ratio:5m > 0.01", "HighErrorRate"),
        ("model:vllm_request_error_ratio:1h / 0.001", "model:vllm_request_error_ratio:1h / 0.01",
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


def test_errors_are_counted_as_the_agent_counts_them() -> None:
    # The agent's errors_per_second (and so the error-rate policy) counts finished_reason error|abort.
    (errors,) = [m for m in ENGINE_METRICS if m.key == "errors"]
    assert errors.label is not None
    label, reasons = errors.label
    seen = 0
    for rule in all_rules(load_rules()):
        for op, value in label_matchers(rule["expr"], label):
            seen += 1
            assert op == "=~" and set(value.split("|")) == reasons, rule.get("record") or rule.get("alert")
    assert seen > 0
