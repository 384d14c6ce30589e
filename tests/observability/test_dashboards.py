"""Grafana dashboards: generated from code, every panel described, filtered, linked and on exported series;
their provisioning files, and ``pitstop dashboards push`` against a fake API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from controlplane.policy.conditions import ErrorRateCondition, ThresholdCondition
from controlplane.policy.policy import Policy
from controlplane.policy_files import load_directory
from engines import ADAPTERS
from enginesim.metrics import EngineMetrics
from pitstop.boards import build, dump
from pitstop.boards.__main__ import main as generate
from pitstop.boards.inputs import Inputs, alert_names, slo_targets
from pitstop.boards.promql import metric_names, selectors
from pitstop.dashboards import load_dashboards, main, push_request
from tests.observability.fake_grafana import FakeGrafana
from tests.observability.rules import (
    DASHBOARDS,
    ENGINE_PREFIXES,
    ROOT,
    RUNBOOK_BASE,
    alerts,
    dashboard_exprs,
    engine_series,
    engine_series_in,
    exported_series,
    load_rules,
    recorded_names,
    runbook_file,
    substitute,
)

TOKEN = "glsa_test-token"
BOARDS = ("pitstop-fleet", "pitstop-gpu", "pitstop-replica")
UNITS = {"s", "percentunit", "bytes", "watt", "celsius", "reqps", "short"}
# Which of the dashboards' variables each family of series carries as a label (the agent's table in
# agent/exporter.py, the pitstop-engines job's target labels on vllm:* and sglang:*, the recording rules' "by
# (model, engine)" and "by (model)").
REPLICA_LABELS = {"node", "model", "replica", "engine"}
CARRIES: tuple[tuple[str, set[str]], ...] = (
    *((prefix, REPLICA_LABELS) for prefix in ENGINE_PREFIXES), ("model_engine:", {"model", "engine"}),
    ("model:", {"model"}), ("pitstop_cp_", set()), ("pitstop_gpu_", {"node", "gpu"}),
    ("pitstop_node_", {"node"}), ("pitstop_replica_", REPLICA_LABELS), ("pitstop_engine_", REPLICA_LABELS),
    ("pitstop_canary_", REPLICA_LABELS),
)


def _board(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "dashboards" / f"{name}.json").read_text())
    return data


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _all_panels() -> list[tuple[str, dict[str, Any]]]:
    return [(name, p) for name in BOARDS for p in _panels(_board(name))]


def _variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def _exprs(panel: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


def _names(panel: dict[str, Any]) -> set[str]:
    return set().union(*(metric_names(e) for e in _exprs(panel)))


def _annotation_exprs(board: dict[str, Any]) -> list[str]:
    return [a["expr"] for a in board["annotations"]["list"] if "expr" in a]


def _red(panel: dict[str, Any]) -> float:
    """The value where a panel's thresholds turn red."""
    values = [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["color"] == "red"]
    assert len(values) == 1, panel["title"]
    return float(values[0])


# --- what the dashboards are made from ---------------------------------------------------------------


def test_the_three_dashboards_exist_with_unique_uids_and_a_recent_schema() -> None:
    boards = [json.loads(p.read_text()) for p in DASHBOARDS]
    assert sorted(b["title"] for b in boards) == ["Pitstop GPU", "Pitstop fleet", "Pitstop replica"]
    assert sorted(b["uid"] for b in boards) == sorted(BOARDS)
    assert all(b["schemaVersion"] >= 36 for b in boards)


def test_the_committed_dashboards_are_what_the_generator_writes(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate(["--check"]) == 0, capsys.readouterr().err
    generated = build(Inputs(targets=slo_targets(load_directory()), alerts=alert_names()))
    assert sorted(generated) == sorted(p.name for p in DASHBOARDS)
    for path in DASHBOARDS:
        assert path.read_text() == dump(generated[path.name]), f"{path.name}: run python -m pitstop.boards"


def test_check_names_the_dashboard_that_differs_and_writing_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in DASHBOARDS:
        shutil.copy(path, tmp_path / path.name)
    edited = json.loads((tmp_path / "pitstop-gpu.json").read_text())
    edited["panels"][1]["title"] = "edited by hand"
    (tmp_path / "pitstop-gpu.json").write_text(json.dumps(edited))
    (tmp_path / "pitstop-replica.json").unlink()

    assert generate(["--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "pitstop-gpu.json: differs" in err and "pitstop-replica.json: missing" in err
    assert "pitstop-fleet.json" not in err
    assert generate(["--dir", str(tmp_path)]) == 0
    assert generate(["--check", "--dir", str(tmp_path)]) == 0


def test_the_makefile_lint_target_runs_the_check() -> None:
    lint = (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/python -m pitstop.boards --check" in lint


# --- the policies' objectives ---------------------------------------------------------------------------


def _objectives(policies: list[Policy]) -> dict[str, float]:
    by_name = {p.name: p.condition for p in policies}
    found = {}
    for name in ("ttft-slo", "itl-slo", "error-rate"):
        condition = by_name[name]
        assert isinstance(condition, ThresholdCondition | ErrorRateCondition), name
        found[name] = condition.threshold
    return found


TTFT = {"model_engine:ttft_seconds:p99_1m", "model_engine:ttft_seconds:p99_5m",
        *(name + "_bucket" for a in ADAPTERS.values() for name in a.sample_names("ttft")),
        "pitstop_canary_ttft_seconds"}
ITL = {"model_engine:itl_seconds:p99_1m", "model_engine:itl_seconds:p99_5m",
       *(name + "_bucket" for a in ADAPTERS.values() for name in a.sample_names("itl"))}
ERRORS = {"model_engine:request_error_ratio:5m", *(n for a in ADAPTERS.values() for n in a.sample_names("errors"))}


def _slo_thresholds(boards: Iterable[dict[str, Any]]) -> dict[str, set[float]]:
    """The red threshold of every latency or error-ratio panel, by the objective it shows."""
    found: dict[str, set[float]] = {"ttft-slo": set(), "itl-slo": set(), "error-rate": set()}
    for board in boards:
        for panel in _panels(board):
            names, unit = _names(panel), panel["fieldConfig"]["defaults"]["unit"]
            if unit == "s" and names & TTFT:
                found["ttft-slo"].add(_red(panel))
            elif unit == "s" and names & ITL:
                found["itl-slo"].add(_red(panel))
            elif unit == "percentunit" and names & ERRORS:
                found["error-rate"].add(_red(panel))
    return found


def test_slo_thresholds_on_the_panels_are_the_shipped_policies() -> None:
    objectives = _objectives(load_directory())
    assert objectives == {"ttft-slo": 0.5, "itl-slo": 0.2, "error-rate": 0.001}  # the shipped values, as documented
    found = _slo_thresholds(_board(n) for n in BOARDS)
    assert found == {name: {value} for name, value in objectives.items()}
    # Four panels at least per objective: the fleet's stat and graph, the replica's graph (and the canary).
    counts = {name: 0 for name in objectives}
    for _, panel in _all_panels():
        unit, names = panel["fieldConfig"]["defaults"]["unit"], _names(panel)
        counts["ttft-slo"] += unit == "s" and bool(names & TTFT)
        counts["itl-slo"] += unit == "s" and bool(names & ITL)
        counts["error-rate"] += unit == "percentunit" and bool(names & ERRORS)
    assert min(counts.values()) >= 3, counts


def test_burn_rate_panels_divide_by_the_policies_error_budgets() -> None:
    budgets = {"ttft_slo_miss": 0.01, "itl_slo_miss": 0.01, "request_error_ratio": 0.001}  # p99, p99, 0.1 %
    burn = [p for _, p in _all_panels() if "burn rate" in p["title"].lower()]
    assert len(burn) == 3
    for panel in burn:
        for expr in _exprs(panel):
            family = next(f for f in budgets if f in expr)
            assert expr.endswith(f" / {budgets[family]:g}"), (panel["title"], expr)
        assert [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 6, 14.4]


def test_a_changed_policy_threshold_moves_the_panels_at_the_next_generation() -> None:
    policies = load_directory()

    def moved(policy: Policy) -> Policy:
        if policy.name not in ("ttft-slo", "error-rate"):
            return policy
        value = 0.75 if policy.name == "ttft-slo" else 0.005
        return policy.model_copy(update={"condition": policy.condition.model_copy(update={"threshold": value})})

    boards = build(Inputs(targets=slo_targets([moved(p) for p in policies]), alerts=alert_names())).values()
    found = _slo_thresholds(boards)
    assert found == {"ttft-slo": {0.75}, "itl-slo": {0.2}, "error-rate": {0.005}}
    fleet = _panels(next(b for b in boards if b["uid"] == "pitstop-fleet"))
    assert any("0.75 s (policy ttft-slo)" in p["description"] for p in fleet)
    budget = next(p for p in fleet if p["title"].startswith("Error budget burn rate"))
    assert all(e.endswith(" / 0.005") for e in _exprs(budget))


# --- panels ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "variables"), [
    ("pitstop-fleet", {"datasource", "node", "engine", "model", "replica"}),
    ("pitstop-gpu", {"datasource", "node", "gpu"}),
    ("pitstop-replica", {"datasource", "node", "engine", "model", "replica"}),
])
def test_every_board_has_its_variables_with_all_as_a_regex(name: str, variables: set[str]) -> None:
    found = _variables(_board(name))
    assert set(found) == variables
    assert found["datasource"]["type"] == "datasource" and found["datasource"]["query"] == "prometheus"
    for var in (v for n, v in found.items() if n != "datasource"):
        assert var["type"] == "query" and var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert var["includeAll"] is True and var["allValue"] == ".*", var["name"]
        assert re.fullmatch(r"label_values\(.+, " + var["name"] + r"\)", var["query"]["query"]), var["query"]
        assert var["refresh"] == 2  # reloaded with the time range: new nodes and replicas appear


@pytest.mark.parametrize("name", BOARDS)
def test_every_panel_is_described_reads_the_datasource_variable_and_fits_the_grid(name: str) -> None:
    board = _board(name)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    for panel in _panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
        assert len(panel.get("description", "")) >= 60, f"{panel['title']}: no description worth the name"
        assert panel["fieldConfig"]["defaults"]["unit"] in UNITS, panel["title"]


def _carried(metric: str) -> set[str]:
    return next((labels for prefix, labels in CARRIES if metric.startswith(prefix)), set())


def test_every_selector_filters_by_the_variables_of_its_board_and_alerts_are_selected_by_name() -> None:
    # The engines' series come from the engines' job alone: another job scraping an engine would match "All" too.
    names = "|".join(sorted({a["alert"] for a in alerts(load_rules())}))
    problems = []
    for name in BOARDS:
        board = _board(name)
        variables = set(_variables(board)) - {"datasource"}
        for panel in _panels(board):
            for expr in _exprs(panel):
                for sel in selectors(expr):
                    where = f"{name} / {panel['title']}: {sel.metric}"
                    # Every variable in a matcher is a regex match, so "All" (.*) matches every series.
                    problems += [f"{where}: {label}{op}{value!r}" for label, op, value in sel.matchers
                                 if "$" in value and op != "=~"]
                    if sel.metric == "ALERTS":
                        if sel.value("alertname") != names or sel.value("alertstate", "=") != "firing":
                            problems.append(f"{where}: not every Pitstop alert by name: {expr}")
                        if sel.value("job") is not None or sel.value("node") not in ("$node", "$node|"):
                            problems.append(f"{where}: by job, or not narrowed by $node: {expr}")
                        continue
                    if sel.metric.startswith(ENGINE_PREFIXES) and sel.value("job", "=") != "pitstop-engines":
                        problems.append(f"{where}: not from the pitstop-engines job")
                    for label in sorted(_carried(sel.metric) & variables):
                        if sel.value(label) != f"${label}":
                            problems.append(f"{where}: not filtered by ${label}")
    assert problems == []


def test_every_board_has_a_firing_alerts_panel_and_the_fleet_counts_them_with_a_fallback() -> None:
    for name in BOARDS:
        assert any("ALERTS" in metric_names(e) for p in _panels(_board(name)) for e in _exprs(p)), name
    stat = next(p for p in _panels(_board("pitstop-fleet")) if p["title"] == "Firing Pitstop alerts")
    assert stat["type"] == "stat" and _exprs(stat)[0].startswith("count(ALERTS{")
    assert _exprs(stat)[0].endswith(" or vector(0)")


def _known_names() -> set[str]:
    """Every sample name somebody exports, and the recording rules, ALERTS and up."""
    engine = CollectorRegistry()  # the simulator's vLLM families, every sample name of them
    EngineMetrics(engine, model_name="m", max_model_len=2048, cache_info={"block_size": "16"})
    vllm = {sample.name for family in engine.collect() for sample in family.samples}
    # Every engine's figures as its adapter names them (SGLang's among them).
    return exported_series() | vllm | engine_series() | recorded_names(load_rules()) | {"ALERTS", "up"}


def unknown_names(exprs: Iterable[tuple[str, str]], known: set[str]) -> dict[str, set[str]]:
    """(where, expr) pairs -> the names each uses that nobody exports."""
    unknown = {}
    for where, expr in exprs:
        missing = metric_names(expr) - known
        if missing:
            unknown[where] = missing
    return unknown


def test_every_name_a_panel_or_annotation_queries_is_exported_by_someone() -> None:
    exprs = [(f"{path.name} / {title}", e) for path in DASHBOARDS for title, e in dashboard_exprs(path)]
    exprs += [(f"{path.name} / annotation", e) for path in DASHBOARDS
              for e in _annotation_exprs(json.loads(path.read_text()))]
    exprs += [(f"{path.name} / variable", e) for path in DASHBOARDS
              for e in (v["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                        for v in json.loads(path.read_text())["templating"]["list"] if v["type"] == "query")]
    assert len(exprs) > 100
    assert unknown_names(exprs, _known_names()) == {}


def test_the_name_check_fails_on_a_name_nobody_exports() -> None:
    known = _known_names()
    exprs = [
        ("fine", 'histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                 '{node=~"$node"}[$__rate_interval])))'),
        ("fine too", 'sum by (kind, outcome) (increase(pitstop_cp_actions_total[1m])) > 0 or vector(0)'),
        ("typo", 'sum(rate(vllm:num_requests_runing{node=~"$node"}[1m]))'),
        ("gone", 'max by (model) (model:pitstop_engine_ttft_p99_seconds:max{model=~"$model"})'),
        ("bogus", 'sum by (node) (pitstop_gpu_bogus_total{gpu="0"}) / on (node) up'),
    ]
    assert unknown_names(exprs, known) == {
        "typo": {"vllm:num_requests_runing"},
        "gone": {"model:pitstop_engine_ttft_p99_seconds:max"},
        "bogus": {"pitstop_gpu_bogus_total"},
    }


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian package prometheus)")
def test_promtool_parses_every_panel_annotation_and_variable_query(tmp_path: Path) -> None:
    values = {"node": "node-a", "engine": ".*", "model": ["m.1", "m2"], "replica": ".*", "gpu": "0"}
    rules = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        exprs = [e for _, e in dashboard_exprs(path)] + _annotation_exprs(board)
        rules += [{"record": f"check:{path.stem.replace('-', '_')}:{i}", "expr": substitute(e, values)}
                  for i, e in enumerate(exprs)]
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "panels.yml")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_substitute_writes_values_as_grafana_does() -> None:
    expr = 'sum(rate(x{node=~"$node", model=~"${model}", replica=~"${replica:regex}"}[$__rate_interval])) [$__range]'
    assert substitute(expr, {"node": ".*", "model": "Qwen2.5", "replica": ["r0", "r1"]}) == (
        'sum(rate(x{node=~".*", model=~"Qwen2\\\\.5", replica=~"(r0|r1)"}[1m])) [1h]')
    assert substitute("x[$__rate_interval]", {}, rate_interval="30s") == "x[30s]"
    with pytest.raises(KeyError, match="gpu"):
        substitute('x{gpu=~"$gpu"}', {"node": ".*"})


@pytest.mark.parametrize(("metric", "unit"), [
    ("_celsius", "celsius"), ("_watts", "watt"), ("pitstop_engine_kv_cache_usage_ratio", "percentunit"),
    ("pitstop_gpu_utilization_ratio", "percentunit"), ("pitstop_replica_rss_bytes", "bytes"),
    ("_seconds_bucket", "s"), ("model_engine:ttft_seconds:", "s"), ("model_engine:itl_seconds:", "s"),
    ("model_engine:e2e_seconds:", "s"), ("pitstop_canary_ttft_seconds", "s"),
])
def test_units_fit_what_the_panels_show(metric: str, unit: str) -> None:
    shown = [(n, p) for n, p in _all_panels() if any(metric in name for name in _names(p))
             and "burn rate" not in p["title"].lower()]
    assert shown
    for name, panel in shown:
        overridden = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]
                      if any(prop["id"] == "unit" for prop in o["properties"])}
        legends = {t["legendFormat"] for t in panel["targets"] if metric in t["expr"]}
        assert panel["fieldConfig"]["defaults"]["unit"] == unit or legends <= overridden, (name, panel["title"])


def test_the_canary_ok_flag_is_not_shown_in_seconds() -> None:
    panels = [p for _, p in _all_panels() if "pitstop_canary_ok" in _names(p)]
    assert panels and all(p["fieldConfig"]["defaults"]["unit"] != "s" for p in panels)
    assert all(not (_names(p) & {"pitstop_canary_ttft_seconds"}) for p in panels)  # split, not mixed


# --- links: runbooks and drill-downs --------------------------------------------------------------------

# Alerts an SRE must reach from the panel that shows their evidence.
TIED = {"TTFTSLOBreach", "ITLSLOBreach", "HighErrorRate", "TTFTSLOBurnRate", "ITLSLOBurnRate",
        "ErrorBudgetBurnRate", "GPUThrottled", "GPUXidErrors", "GPUEccErrors", "GPUHot", "EngineStalled",
        "ReplicaDown", "HostRSSLeak", "KVCacheSaturated", "CanaryFailing", "ReplicaCrashLoop", "ReplicaRestarting",
        "GPUMemoryHigh", "GPUOrphanProcesses", "ReplicaGPUMemoryGrowing", "NodeCordoned", "GPUCordoned",
        "EngineScrapeErrors", "RemediationActionsFailing", "AgentDown"}


def test_alert_tied_panels_link_their_alerts_runbook_pages() -> None:
    rules = {a["alert"]: a["annotations"]["runbook_url"] for a in alerts(load_rules())}
    linked: set[str] = set()
    for name, panel in _all_panels():
        for link in panel.get("links", []):
            alert = link["title"].removeprefix("Runbook: ")
            assert link["title"] == f"Runbook: {alert}" and alert in rules, (name, panel["title"], link)
            assert link["url"] == f"{RUNBOOK_BASE}runbooks/alerts/{alert}.md" == rules[alert]
            assert runbook_file(link["url"]).is_file(), link["url"]
            assert link["targetBlank"] is True
            linked.add(alert)
    assert TIED - linked == set()
    # A panel linked to an SLO alert is the one that shows its series.
    for _, panel in _all_panels():
        titles = {link["title"] for link in panel.get("links", [])}
        if "Runbook: TTFTSLOBreach" in titles:
            assert _names(panel) & TTFT, panel["title"]
        if "Runbook: GPUThrottled" in titles:
            assert _names(panel) & {"pitstop_gpu_throttle_reason", "pitstop_gpu_temperature_celsius",
                                    "pitstop_gpu_slowdown_temperature_celsius"}, panel["title"]


def _data_links() -> list[tuple[str, str, dict[str, Any]]]:
    return [(name, panel["title"], link) for name, panel in _all_panels()
            for link in panel["fieldConfig"]["defaults"].get("links", [])]


def test_drill_down_links_carry_the_time_range_the_datasource_and_the_clicked_labels() -> None:
    needs = {"pitstop-fleet": {"model"}, "pitstop-gpu": {"node"}, "pitstop-replica": {"node", "model", "replica"}}
    seen: dict[tuple[str, str], int] = {}
    for name, title, link in _data_links():
        url = link["url"]
        if url.startswith("https://"):  # a firing alert's runbook
            assert url == f"{RUNBOOK_BASE}runbooks/alerts/${{__data.fields.alertname}}.md", (name, title)
            continue
        target = re.fullmatch(r"/d/([\w-]+)/[\w-]+\?(.*)", url)
        assert target, url
        uid, query = target.groups()
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        assert "${__url_time_range}" in query.split("&") and params["var-datasource"] == "${datasource}", url
        for var in needs[uid]:
            assert re.fullmatch(r"\$\{__(field\.labels|data\.fields)\." + var + r"\}", params[f"var-{var}"]), url
        seen[(name, uid)] = seen.get((name, uid), 0) + 1
    # fleet -> model (the fleet narrowed), -> node (GPUs), -> replica; the GPU board -> the replica.
    assert {("pitstop-fleet", "pitstop-fleet"), ("pitstop-fleet", "pitstop-gpu"), ("pitstop-fleet", "pitstop-replica"),
            ("pitstop-gpu", "pitstop-replica")} <= set(seen)


def test_per_model_and_per_replica_panels_drill_down_by_their_legend() -> None:
    for name, panel in _all_panels():
        links = {link["url"].split("?")[0] for link in panel["fieldConfig"]["defaults"].get("links", [])}
        legends = {t.get("legendFormat", "") for t in panel["targets"]}
        if name == "pitstop-fleet" and panel["type"] in ("timeseries", "stat"):
            if any(legend.startswith("{{node}}/{{replica}}") for legend in legends):
                assert "/d/pitstop-replica/pitstop-replica" in links, panel["title"]
            elif legends and all("{{model}}" in legend for legend in legends):
                assert "/d/pitstop-fleet/pitstop-fleet" in links, panel["title"]


@pytest.mark.parametrize("name", BOARDS)
def test_every_board_links_the_others_keeping_variables_and_time(name: str) -> None:
    links = _board(name)["links"]
    assert all(link["includeVars"] is True and link["keepTime"] is True for link in links)
    direct = {link["url"] for link in links if link["type"] == "link"}
    assert direct == {f"/d/{uid}/{uid}" for uid in BOARDS if uid != name}
    assert any(link["type"] == "dashboards" and link["tags"] == ["pitstop"] for link in links)


@pytest.mark.parametrize("name", BOARDS)
def test_every_board_marks_pitstops_actions_as_annotations(name: str) -> None:
    queries = [a for a in _board(name)["annotations"]["list"] if "expr" in a]
    assert len(queries) == 1
    actions = queries[0]
    assert actions["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and actions["enable"] is True
    assert metric_names(actions["expr"]) == {"pitstop_cp_actions_total"}
    assert "{{kind}}" in actions["titleFormat"] and "{{outcome}}" in actions["titleFormat"]
    assert set(actions["tagKeys"].split(",")) == {"kind", "outcome"}


@pytest.mark.parametrize(("name", "titles"), [
    ("pitstop-fleet", ["READY replicas per model", "TTFT p99", "TTFT p50 / p95 / p99", "Inter-token latency p99",
                       "End-to-end latency", "Generation tokens/s", "requests/s", "Queue", "KV cache",
                       "Error ratio", "burn rate", "restarts", "actions", "Firing Pitstop alerts", "versions"]),
    ("pitstop-gpu", ["Temperature vs own slowdown threshold", "Throttle reasons", "GPU memory used",
                     "Utilisation", "Power vs limit", "XID errors by code and blast radius", "ECC", "Cordoned"]),
    ("pitstop-replica", ["State", "TTFT", "Inter-token latency", "Host RSS", "RSS growth", "GPU memory",
                         "Canary TTFT", "Canary OK", "Stalled", "KV cache", "Error ratio", "Firing alerts"]),
])
def test_dashboards_carry_the_panels_an_sre_looks_for(name: str, titles: list[str]) -> None:
    have = [p["title"].lower() for p in _panels(_board(name))]
    missing = [t for t in titles if not any(t.lower() in h for h in have)]
    assert missing == []


def test_latency_comes_from_the_engines_histograms_not_the_agents_window_gauges() -> None:
    used = set().union(*(_names(p) for _, p in _all_panels()))
    assert not used & {"pitstop_engine_ttft_seconds", "pitstop_engine_itl_seconds", "pitstop_engine_e2e_p99_seconds",
                       "pitstop_engine_requests_per_second", "pitstop_engine_generation_tokens_per_second",
                       "pitstop_engine_errors_per_second"}
    replica = [e for _, e in dashboard_exprs(ROOT / "dashboards" / "pitstop-replica.json") if "histogram_quantile" in e]
    assert len(replica) >= 9
    for expr in replica:
        # Summed by engine too: two engines' bucket bounds are never added together.
        assert expr.startswith("histogram_quantile(0.") and ", sum by (le, engine) (rate(" in expr, expr
        assert re.search(r"\[\$__rate_interval\]\)+$", expr), expr


def test_no_panel_reads_one_engine_alone() -> None:
    # A panel on an engine's own series reads every engine's, each by its adapter's names, and counts SGLang's
    # tensor and pipeline copies once; gauges every engine has come from the agent (pitstop_engine_*).
    problems = []
    for name, panel in _all_panels():
        for expr in _exprs(panel):
            read = engine_series_in(expr)
            if not read:
                continue
            for adapter in ADAPTERS.values():
                mine = {n for n in read if n.startswith(adapter.metric_prefix)}
                known = {n + s for m in adapter.metrics for n in m.names for s in ("", "_bucket", "_count", "_sum")}
                if not mine or not mine <= known:
                    problems.append(f"{name} / {panel['title']}: {adapter.name} reads {sorted(mine)}")
                copies = f"max without ({', '.join(sorted(adapter.copy_labels))})"
                if adapter.copy_labels and copies not in expr:
                    problems.append(f"{name} / {panel['title']}: {adapter.name}'s copies are counted per rank")
    assert problems == []


def test_the_gpu_temperature_panel_plots_the_gpus_own_threshold_not_a_constant() -> None:
    exprs = [e for title, e in dashboard_exprs(ROOT / "dashboards" / "pitstop-gpu.json") if "Temperature" in title]
    assert any("pitstop_gpu_slowdown_temperature_celsius" in e for e in exprs)


def test_the_throttle_panel_tells_fault_reasons_from_caps() -> None:
    gpu = _panels(_board("pitstop-gpu"))
    timeline = next(p for p in gpu if p["title"] == "Throttle reasons")
    assert timeline["type"] == "state-timeline"
    assert 'fault="true"' in _exprs(timeline)[0] and 'fault="false"' in _exprs(timeline)[0]
    texts = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert texts["2"]["color"] == "red" and "fault" in texts["2"]["text"] and texts["1"]["color"] != "red"
    xid = next(p for p in gpu if p["title"] == "XID errors by code and blast radius")
    assert "sum by (node, gpu, xid, blast_radius)" in _exprs(xid)[0]
    assert "{{xid}}" in xid["targets"][0]["legendFormat"] and "{{blast_radius}}" in xid["targets"][0]["legendFormat"]


def test_provisioning_files_point_grafana_at_the_dashboards_and_a_prometheus() -> None:
    prov = ROOT / "dashboards" / "provisioning"
    providers = yaml.safe_load((prov / "dashboards" / "pitstop.yaml").read_text())["providers"]
    assert providers[0]["type"] == "file" and providers[0]["folder"] == "Pitstop"
    assert providers[0]["options"]["path"]
    sources = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert sources[0]["type"] == "prometheus" and sources[0]["url"].startswith("http")


def test_push_creates_the_folder_once_and_overwrites_dashboards_by_uid(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeGrafana(TOKEN) as grafana:
        args = ["push", "--grafana-url", grafana.url, "--token", TOKEN, "--folder", "Pitstop"]
        assert main(args) == 0
        assert main(args) == 0
        state = grafana.state

    assert state.folders == [{"uid": "pitstop", "title": "Pitstop"}]
    assert sorted(state.dashboards) == ["pitstop-fleet", "pitstop-gpu", "pitstop-replica"]
    assert state.versions == {"pitstop-fleet": 2, "pitstop-gpu": 2, "pitstop-replica": 2}
    posts = [r for r in state.requests if r.path == "/api/dashboards/db"]
    assert len(posts) == 6
    for r in posts:
        assert r.headers["Authorization"] == f"Bearer {TOKEN}"
        assert r.body["overwrite"] is True and r.body["folderUid"] == "pitstop"
        assert r.body["dashboard"]["id"] is None
    # The posted dashboard is the file's content.
    assert state.dashboards["pitstop-gpu"]["dashboard"]["panels"] == _board("pitstop-gpu")["panels"]
    out = capsys.readouterr().out
    assert "pitstop-fleet\tPitstop fleet\tversion 2\t/d/pitstop-fleet/" in out


def test_push_reuses_an_existing_folder_by_title() -> None:
    with FakeGrafana(TOKEN) as grafana:
        grafana.state.folders.append({"uid": "ops-42", "title": "SRE"})
        assert main(["push", "--grafana-url", grafana.url, "--token", TOKEN, "--folder", "SRE"]) == 0
        posts = [r for r in grafana.state.requests if r.path == "/api/dashboards/db"]
        assert {r.body["folderUid"] for r in posts} == {"ops-42"}
        assert not [r for r in grafana.state.requests if (r.method, r.path) == ("POST", "/api/folders")]


def test_push_with_a_wrong_token_fails_with_grafanas_answer(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeGrafana(TOKEN) as grafana:
        assert main(["push", "--grafana-url", grafana.url, "--token", "wrong"]) == 1
        assert grafana.state.dashboards == {}
    assert "Grafana refused" in capsys.readouterr().err


def test_push_refuses_a_file_that_is_not_a_dashboard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text('{"title": "no uid"}')
    with FakeGrafana(TOKEN) as grafana:
        assert main(["push", "--grafana-url", grafana.url, "--token", TOKEN, "--dir", str(tmp_path)]) == 2
        assert grafana.state.requests == []
    assert "a.json: not a Grafana dashboard" in capsys.readouterr().err


def test_push_request_drops_a_foreign_numeric_id_and_general_has_no_folder() -> None:
    board = load_dashboards(ROOT / "dashboards")[0] | {"id": 17}
    body = push_request(board, None, "m")
    assert body["dashboard"]["id"] is None and "folderUid" not in body and body["overwrite"] is True
