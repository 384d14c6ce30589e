"""The remediation API: loaded policies and file errors, the live dry run (API and CLI), breaker access rights."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane import policy_cli
from tests.remediation.fleet import SimAgent, SimReplica, fleet

GOOD = "name: hot-page\ncondition: {detector: thermal, for: 30s}\naction: {kind: alert, severity: page}\n"
BROKEN = "name: hot-page\ncondition: {detector: thermal, for: 30s}\naction:\n  kind: alert\n  severity: loud\n"


def test_policies_lists_the_defaults_and_the_configured_ones(tmp_path: Path) -> None:
    extra = tmp_path / "policies"
    extra.mkdir()
    (extra / "hot.yaml").write_text(GOOD)
    with fleet(tmp_path, [], policy_dirs=[str(extra)]) as f:
        body = f.client.get("/v1/policies").json()
        names = [p["name"] for p in body["policies"]]
        assert {"stall", "ttft-slo", "xid-hardware", "hot-page"} <= set(names)
        assert body["errors"] == [] and body["enabled"] is True


def test_a_broken_file_is_reported_with_file_line_and_field_and_the_last_good_set_keeps_running(
        tmp_path: Path) -> None:
    extra = tmp_path / "policies"
    extra.mkdir()
    path = extra / "hot.yaml"
    path.write_text(GOOD)
    agent = SimAgent("gpu-a", [SimReplica("r0")], temperature=87.0)
    with fleet(tmp_path, [agent], policy_dirs=[str(extra)]) as f:
        assert "hot-page" in [p["name"] for p in f.client.get("/v1/policies").json()["policies"]]
        path.write_text(BROKEN)
        body = f.client.get("/v1/policies").json()
        [error] = body["errors"]
        assert error["file"] == str(path) and error["line"] == 5 and error["field"] == "action.severity"
        assert "hot-page" in [p["name"] for p in body["policies"]], "the last good set is still loaded"
        f.run(60)
        assert any(a["kind"] == "alert" for a in f.actions(policy="hot-page")), "and it still acts"


def test_explain_shows_what_each_policy_would_do_on_the_live_fleet(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0")], temperature=87.0)
    with fleet(tmp_path, [agent], policies_enabled=False) as f:
        f.run(150)
        assert f.actions() == [], "the policy job is off: explain is a dry run only"
        report = f.client.get("/v1/policies/explain").json()
        thermal = next(p for p in report["policies"] if p["name"] == "thermal")
        assert thermal["status"] == "acting"
        [decision] = thermal["decisions"]
        assert decision["verdict"] == "allowed" and decision["action"]["target"]["kind"] == "gpu"
        assert next(p for p in report["policies"] if p["name"] == "stall")["status"] == "quiet"
        # The CLI asks the same endpoint when no snapshot is given.
        assert policy_cli.main(["explain", "--api-url", "http://testserver"], client=f.client) == 0
        out = capsys.readouterr().out
        assert "thermal: acting" in out and "[ALLOW] alert gpu:gpu-a/0" in out


def test_explain_cli_says_when_the_control_plane_cannot_be_reached(capsys: pytest.CaptureFixture[str]) -> None:
    assert policy_cli.main(["explain", "--api-url", "http://127.0.0.1:9"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_resetting_the_breaker_needs_an_operator(tmp_path: Path) -> None:
    with fleet(tmp_path, [], viewer_tokens=["v-secret"], operator_tokens=["o-secret"]) as f:
        viewer = {"Authorization": "Bearer v-secret"}
        operator = {"Authorization": "Bearer o-secret"}
        assert f.client.get("/v1/remediation/breaker", headers=viewer).json()["tripped"] is False
        assert f.client.post("/v1/remediation/breaker/reset", headers=viewer).status_code == 403
        assert f.client.post("/v1/remediation/breaker/reset").status_code == 401
        done = f.client.post("/v1/remediation/breaker/reset", headers=operator)
        assert done.status_code == 200 and done.json()["reset_at"] is not None


def test_explain_cli_sends_the_token_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with fleet(tmp_path, [], viewer_tokens=["v-secret"]) as f:
        monkeypatch.delenv("PITSTOP_TOKEN", raising=False)
        assert policy_cli.main(["explain", "--api-url", "http://testserver"], client=f.client) == 1
        assert "401" in capsys.readouterr().err
        monkeypatch.setenv("PITSTOP_TOKEN", "v-secret")
        assert policy_cli.main(["explain", "--api-url", "http://testserver", "--json"], client=f.client) == 0
        assert '"policies"' in capsys.readouterr().out
