"""Grafana dashboards: their shape, their provisioning files, and ``pitstop dashboards push`` against a fake API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pitstop.dashboards import load_dashboards, main, push_request
from tests.observability.fake_grafana import FakeGrafana
from tests.observability.rules import DASHBOARDS, ROOT, dashboard_exprs

TOKEN = "glsa_test-token"


def _board(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "dashboards" / f"{name}.json").read_text())
    return data


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def test_the_three_dashboards_exist_with_unique_uids_and_a_recent_schema() -> None:
    boards = [json.loads(p.read_text()) for p in DASHBOARDS]
    assert sorted(b["title"] for b in boards) == ["Pitstop GPU", "Pitstop fleet", "Pitstop replica"]
    assert len({b["uid"] for b in boards}) == 3
    assert all(b["schemaVersion"] >= 36 for b in boards)


@pytest.mark.parametrize(("name", "variables"), [
    ("pitstop-fleet", {"datasource", "node", "model", "replica"}),
    ("pitstop-gpu", {"datasource", "node", "gpu"}),
    ("pitstop-replica", {"datasource", "node", "model", "replica"}),
])
def test_every_panel_reads_the_datasource_variable_and_filters_by_the_template_variables(
    name: str, variables: set[str]
) -> None:
    board = _board(name)
    found = _variables(board)
    assert set(found) == variables
    assert found["datasource"]["type"] == "datasource" and found["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["gridPos"]["x"] >= 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        for target in panel["targets"]:
            # Every pitstop_* selector is narrowed by the dashboard's variables (control-plane series have none).
            expr = target["expr"]
            if "pitstop_cp_" not in expr and "ALERTS" not in expr and "node=~\"$node\"" not in expr:
                pytest.fail(f"{name} / {panel['title']}: not filtered by $node: {expr}")


@pytest.mark.parametrize(("name", "titles"), [
    ("pitstop-fleet", ["READY replicas per model", "TTFT p99", "Inter-token latency p99", "Generation tokens/s",
                       "Queue", "KV cache", "Error ratio", "restarts", "actions"]),
    ("pitstop-gpu", ["Temperature vs own slowdown threshold", "GPU memory used", "Utilisation",
                     "Power vs limit", "XID", "Thermal slowdown"]),
    ("pitstop-replica", ["State", "TTFT", "Host RSS", "RSS growth", "GPU memory", "Canary"]),
])
def test_dashboards_carry_the_panels_an_sre_looks_for(name: str, titles: list[str]) -> None:
    have = [p["title"].lower() for p in _panels(_board(name))]
    missing = [t for t in titles if not any(t.lower() in h for h in have)]
    assert missing == []


def test_the_gpu_temperature_panel_plots_the_gpus_own_threshold_not_a_constant() -> None:
    exprs = [e for title, e in dashboard_exprs(ROOT / "dashboards" / "pitstop-gpu.json") if "Temperature" in title]
    assert any("pitstop_gpu_slowdown_temperature_celsius" in e for e in exprs)


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
