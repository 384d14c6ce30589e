"""The alert rules: promtool accepts and tests them, every alert is complete, tested, and names real series."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.observability.rules import (
    DASHBOARDS,
    ROOT,
    RULE_TESTS,
    RULES,
    RUNBOOK_BASE,
    alerts,
    alerts_expected_to_fire,
    dashboard_exprs,
    exported_series,
    load_rules,
    pitstop_series,
    recorded_names,
    runbook_file,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian package prometheus)")

# What the brief of the rules promises to cover, by alert name.
REQUIRED = {
    "ReplicaDown", "ReplicaCrashLoop", "EngineStalled", "CanaryFailing", "TTFTSLOBreach", "ITLSLOBreach",
    "HighErrorRate", "KVCacheSaturated", "GPUHot", "GPUThrottled", "GPUXidErrors", "GPUMemoryHigh",
    "HostRSSLeak", "EngineScrapeErrors", "AgentDown", "ControlPlaneNoReports", "ControlPlaneStaleNodes",
    "ControlPlaneDown",
}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


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
def test_promtool_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    # The unit tests are not vacuous: moving the TTFT objective from 500 ms to 1 s makes them fail.
    (tmp_path / "tests").mkdir()
    broken = RULES.read_text().replace("model:pitstop_engine_ttft_p99_seconds:max > 0.5",
                                       "model:pitstop_engine_ttft_p99_seconds:max > 1")
    (tmp_path / "pitstop-rules.yml").write_text(broken)
    test_file = tmp_path / "tests" / "slo.yml"
    test_file.write_text((ROOT / "alerts" / "tests" / "slo.yml").read_text())
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode != 0
    assert "TTFTSLOBreach" in result.stdout + result.stderr


def test_every_required_alert_exists_and_is_unit_tested() -> None:
    names = {a["alert"] for a in alerts(load_rules())}
    assert names >= REQUIRED, REQUIRED - names
    untested = names - alerts_expected_to_fire()
    assert untested == set(), f"alerts without a firing promtool test: {untested}"


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


def test_rules_and_dashboards_name_only_exported_series() -> None:
    data = load_rules()
    known = exported_series() | recorded_names(data)
    unknown = {}
    for rule in data["groups"][0]["rules"] + [r for g in data["groups"][1:] for r in g["rules"]]:
        missing = pitstop_series(rule["expr"]) - known
        if missing:
            unknown[rule.get("alert") or rule.get("record")] = missing
    for board in DASHBOARDS:
        for title, expr in dashboard_exprs(board):
            missing = pitstop_series(expr) - known
            if missing:
                unknown[f"{board.name}: {title}"] = missing
    assert unknown == {}


def test_the_series_check_notices_a_misspelt_name() -> None:
    known = exported_series()
    assert pitstop_series('increase(pitstop_gpu_xid_events_total{node="a"}[5m])') <= known
    assert pitstop_series("pitstop_gpu_xid_total > 0") - known == {"pitstop_gpu_xid_total"}
