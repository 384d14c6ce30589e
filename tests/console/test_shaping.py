"""The console's pure shaping: what each page says, from API answers written out by hand."""

from __future__ import annotations

from controlplane.console import actions, alerts, overview, palette, policy_view, previews, replica_view, tiles
from controlplane.console.client import Outcome


def test_a_rolling_restart_shows_replica_n_of_m_and_its_phase() -> None:
    action = {"replicas": ["a/r0", "a/r1", "a/r2"], "params": {"batch_size": 1, "rollout": {
        "phase": "rolling", "queue": [["a/r2"]], "done": ["a/r0"], "batch": {"a/r1": 3}}}}
    progress = actions.rollout_progress(action)
    assert progress is not None and (progress.done, progress.total, progress.phase) == (1, 3, "rolling")
    assert progress.text == "1 of 3 replicas done · phase rolling · restarting a/r1"
    assert actions.rollout_progress({"params": {}}) is None


def test_gpu_tiles_are_judged_against_their_own_limits() -> None:
    # The same 84 °C: amber on a board that slows at 87, green on one that slows at 95.
    assert tiles.temperature_status(84, 87) == "amber" and tiles.temperature_status(84, 95) == "green"
    assert tiles.temperature_status(87, 87) == "red" and tiles.temperature_status(None, 87) == "unknown"
    assert tiles.memory_status(130, 141) == "amber" and tiles.memory_status(140, 141) == "red"
    tile = tiles.gpu_tile({"node": "a", "index": 1, "name": "L4", "temperature_celsius": 80.0,
                           "slowdown_temperature_celsius": 83.0, "throttle_reasons": ["hw_thermal_slowdown"],
                           "xid_events_total": 2, "last_xid": 79, "power_watts": 70.0, "power_limit_watts": 72.0,
                           "cordoned": True})
    assert tile["badges"].startswith(":orange-badge[80 °C / slows at 83]")
    assert tile["lines"][0] == "util - · power 70 / 72 W" and "hw_thermal_slowdown" in tile["lines"][1]
    assert tile["lines"][2].startswith("XID events 2 (last 79)") and tile["lines"][3].startswith("CORDONED")


def test_models_in_trouble_come_first_with_their_alerts() -> None:
    summary = {"models": [
        {"model": "ok", "status": "green", "replicas": 1, "ready": 1, "by_state": {"READY": 1}, "objectives": []},
        {"model": "bad", "status": "red", "replicas": 2, "ready": 1, "by_state": {"READY": 1, "FATAL": 1},
         "tokens_per_second": 1234.5, "objectives": [
             {"name": "error_ratio", "value": 0.02, "target": 0.001, "status": "red"}]}]}
    firing = [{"state": "firing", "severity": "page", "labels": {"alertname": "pitstop-error-rate", "model": "bad",
                                                                 "target": "model:bad"}, "silenced_by": [3]}]
    bad, ok = overview.model_cards(summary, firing)
    assert bad["headline"] == ":red[:material/error:] **bad** · 1 of 2 serving" and ok["model"] == "ok"
    assert bad["objectives"] == ":red-badge[error ratio 2% / 0.1%]" and bad["throughput"] == "1,234 tokens/s"
    assert bad["states"] == ":green-badge[1 READY] :red-badge[1 FATAL]"
    assert bad["alerts"] == ["page: pitstop-error-rate on model:bad (silenced)"] and ok["alerts"] == []


def test_the_breaker_and_the_modes_are_said_first() -> None:
    lines = overview.automation_lines({"automation": {"policies_enabled": True, "policies": 3, "dry_run": ["x"],
                                                      "approval": [], "breaker": {"tripped": True, "reason": "r"}}})
    assert lines[0][0] == "error" and lines[0][1].startswith("Circuit breaker TRIPPED")
    assert lines[-1] == ("info", "3 policies loaded; dry run: x")
    policy = {"name": "p", "enabled": True, "guardrails": {"require_approval": True}}
    assert policy_view.mode(policy) == "approval" and policy_view.mode({**policy, "enabled": False}) == "disabled"


def test_previews_and_outcomes_read_as_sentences() -> None:
    preview = {"verdict": "suppressed", "guardrail": "budget", "reason": "1 READY left", "state": "suppressed",
               "replicas": ["a/r0"], "summary": "held by the disruption budget: 1 READY left",
               "impact": [{"model": "m", "replicas": 2, "ready": 1, "out_at_once": 1, "stay_serving": 0,
                           "floor": 1}]}
    assert not previews.goes_ahead(preview)
    assert previews.preview_lines(preview)[1:] == [
        "guardrails: suppressed by budget: 1 READY left", "it would be recorded as suppressed",
        "replicas it stops or restarts: a/r0", "m: 1 of 2 READY, 1 out at once, 0 stay serving (budget floor 1)"]
    held = Outcome(True, "done", 201, {"id": 7, "kind": "restart", "target": "replica:a/r0", "state": "suppressed",
                                       "guardrails": [{"verdict": "suppressed", "guardrail": "budget",
                                                       "reason": "1 READY left"}]})
    assert previews.outcome_line(held) == ("action #7 restart replica:a/r0: suppressed "
                                           "(suppressed by budget: 1 READY left)")


def test_filters_and_silence_matchers() -> None:
    rows = replica_view.table_rows([
        {"node": "a", "name": "r0", "model": "m", "state": "READY", "engine_args": ["--max-num-seqs", "8"]},
        {"node": "b", "name": "r1", "model": "m", "state": "FATAL", "node_status": "stale", "engine_args": []}])
    assert [r["replica"] for r in replica_view.filter_rows(rows, states=["FATAL"])] == ["b/r1"]
    assert [r["replica"] for r in replica_view.filter_rows(rows, text="num-seqs")] == ["a/r0"]
    assert rows[1]["state"] == "FATAL (stale)"
    alert = {"labels": {"alertname": "pitstop-stall", "target": "replica:a/r0", "node": "a", "replica": "r0",
                        "severity": "page"}}
    assert alerts.matchers_for(alert) == ['alertname="pitstop-stall"', 'target="replica:a/r0"', 'node="a"',
                                          'replica="r0"']
    assert alerts.parse_matcher_lines(' a="1"\n\n b="2" ') == ['a="1"', 'b="2"']


def test_every_replica_state_has_one_colour() -> None:
    domain, colours = palette.state_scale()
    assert "READY" in domain and len(set(colours)) == len(colours)
    assert palette.state_colour("READY") == "#2e7d32" and palette.state_colour("NEW") == palette.UNKNOWN_COLOUR
