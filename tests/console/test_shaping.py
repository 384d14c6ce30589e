"""The console's pure shaping: what each page says, from API answers written out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.console import actions, alerts, overview, palette, policy_view, previews, replica_view, tiles
from controlplane.console.client import Outcome

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_a_rolling_restart_shows_replica_n_of_m_and_its_phase() -> None:
    action = {"replicas": ["a/r0", "a/r1", "a/r2"], "params": {"batch_size": 1, "rollout": {
        "phase": "rolling", "queue": [["a/r2"]], "done": ["a/r0"], "batch": {"a/r1": 3}}}}
    progress = actions.rollout_progress(action, T0)
    assert progress is not None and (progress.done, progress.total, progress.phase) == (1, 3, "rolling")
    assert progress.text == "1 of 3 replicas done · phase rolling · restarting a/r1"  # no start: no estimate
    assert actions.rollout_progress({"params": {}}, T0) is None


def _at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def _left(rollout: dict[str, object], now: float, **params: object) -> str:
    action = {"state": "running", "started_at": _at(0), "replicas": ["a/r0", "a/r1", "a/r2", "a/r3"],
              "params": {**params, "rollout": rollout}}
    progress = actions.rollout_progress(action, T0 + timedelta(seconds=now))
    assert progress is not None
    return progress.text.split(" · ")[-1]


def test_a_rollout_says_its_time_left_from_the_pace_of_the_replicas_done() -> None:
    four = {"phase": "rolling", "queue": [["a/r0"], ["a/r1"], ["a/r2"], ["a/r3"]]}
    assert _left(four, 5) == "time left: known once the first replica is back"
    first = {"phase": "rolling", "queue": [["a/r1"], ["a/r2"], ["a/r3"]], "batch": {"a/r0": 2},
             "batch_started_at": _at(2)}
    assert _left(first, 30) == "time left: known once the first replica is back"
    # Two done in 120 s (60 s each), the third 20 s in: 40 s for it and 60 s for the last.
    mid = {"phase": "rolling", "queue": [["a/r3"]], "done": ["a/r0", "a/r1"], "batch": {"a/r2": 2},
           "batch_started_at": _at(120)}
    assert _left(mid, 140) == "about 100 s left"
    assert _left({**mid, "queue": [["a/r3"]] * 4}, 140) == "about 5 min left"  # minutes from two on
    # Past the estimate the batch in flight counts nothing, never less: the last one is due any moment.
    assert _left(mid, 400) == "about 60 s left"
    assert _left({**mid, "queue": []}, 400) == "done any moment now"
    # Waiting on the budget between batches: the wait so far is part of the pace.
    waiting = {"phase": "rolling", "queue": [["a/r2", "a/r3"]], "done": ["a/r0", "a/r1"], "waiting": "waiting: x"}
    assert _left(waiting, 90, batch_size=2) == "about 90 s left"
    # A canaried rollout's pace is the canary's own restart (its judging is no replica's restart).
    rolled = {"phase": "rolling", "canary": "a/r0", "canary_ready_at": _at(45), "done": ["a/r0"],
              "queue": [["a/r2"], ["a/r3"]], "batch": {"a/r1": 4}, "batch_started_at": _at(200)}
    assert _left(rolled, 215) == "about 2 min left"
    finished = {"state": "failed", "started_at": _at(0), "params": {"rollout": mid}}
    progress = actions.rollout_progress(finished, T0 + timedelta(seconds=140))
    assert progress is not None and progress.text.endswith("restarting a/r2")  # over: nothing is left


def test_a_canary_says_when_it_is_judged() -> None:
    converging = {"phase": "canary", "canary": "a/r0", "batch": {"a/r0": 2}, "batch_started_at": _at(0)}
    assert _left(converging, 30) == "time left: known once the canary is back"
    ready = {"phase": "canary", "canary": "a/r0", "canary_ready_at": _at(40), "batch": {"a/r0": 2}}
    window = timedelta(seconds=120)
    action = {"state": "running", "started_at": _at(0), "params": {"rollout": ready}}
    judged = actions.rollout_progress(action, T0 + timedelta(seconds=120), canary_window=window)
    assert judged is not None and judged.text.endswith(" · canary judged within 40 s, sooner once its evidence is in")
    late = actions.rollout_progress(action, T0 + timedelta(seconds=200), canary_window=window)
    assert late is not None and late.text.endswith(" · canary judged any moment now")
    assert _left(ready, 83) == "canary READY for 45 s, judged once its window has run"  # no window known
    # The plan keeps when its window ends (the control plane's canary_window_seconds): counted down to that.
    kept = {**ready, "canary_judged_at": _at(100)}
    assert _left(kept, 70) == "canary judged within 30 s, sooner once its evidence is in"
    short = {**ready, "canary_verdict": {"verdict": "wait", "reason": "too few readings"}}
    assert _left(short, 300) == "canary judged once enough of its readings come"
    # Waiting on evidence within the window still counts down to the window's end.
    gathering = {**kept, "canary_verdict": {"verdict": "wait", "reason": "evidence not yet in: itl ..."}}
    assert _left(gathering, 70) == "canary judged within 30 s, sooner once its evidence is in"


def test_a_canarys_evidence_is_shown_where_it_stands() -> None:
    figures = {"z_boundary": 3.08, "ratio": 1.1, "itl_effect": 0.41, "itl_z": -1.2, "itl_n_canary": 120.0,
               "itl_n_baseline": 1240.0}
    action = {"state": "running", "params": {"rollout": {
        "phase": "canary", "canary": "a/r0", "canary_verdict": {
            "verdict": "wait", "reason": "evidence not yet in", "figures": figures}}}}
    lines = actions.evidence_lines(action)
    assert lines[0] == "canary: wait: evidence not yet in"
    assert lines[1] == ("  evidence, itl: P(canary > 1.10x baseline) 0.41 over n 120 vs 1,240; z -1.2, a verdict "
                        "at ±3.08: undecided")
    decided = actions.evidence_figures({**figures, "itl_z": -4.0})
    assert decided[0].endswith(": no worse")


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
    # The button follows the control plane's fence (the node's cordoned_gpus); the agent's own flag lags it.
    [n] = tiles.by_node([{"name": "a", "cordoned_gpus": [1]}], [
        {"node": "a", "index": 0, "cordoned": True}, {"node": "a", "index": 1, "cordoned": False}])
    uncordoned, fenced = n["tiles"]
    assert fenced["cordoned"] and fenced["lines"][-1] == "CORDONED: its replicas drain once the agent applies it"
    assert not uncordoned["cordoned"]
    assert uncordoned["lines"][-1] == "uncordoned: its replicas start again once the agent applies it"


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
    assert rows[1]["state"] == "FATAL (stale)" and rows[0]["engine flags"] == "--max-num-seqs 8"
    # The filters are the control plane's: one page's request, each multi-choice filter one repeated parameter.
    assert replica_view.table_query(states=["FATAL"], text=" num-seqs ", sort="TTFT p99, slowest first", page=3) == {
        "view": "table", "model": None, "node": None, "state": ("FATAL",), "q": "num-seqs",
        "sort": "-ttft_p99_seconds", "offset": 400, "limit": 200}
    assert replica_view.table_query(sort="gone", page=0)["sort"] == "node"
    assert replica_view.table_query(page=0)["offset"] == 0
    assert replica_view.options({"m1": 3, "m0": 1}, ["old"]) == ["m0", "m1", "old"]  # a choice the fleet lost
    alert = {"labels": {"alertname": "pitstop-stall", "target": "replica:a/r0", "node": "a", "replica": "r0",
                        "severity": "page"}}
    assert alerts.matchers_for(alert) == ['alertname="pitstop-stall"', 'target="replica:a/r0"', 'node="a"',
                                          'replica="r0"']
    assert alerts.parse_matcher_lines(' a="1"\n\n b="2" ') == ['a="1"', 'b="2"']


def test_the_table_says_which_rows_of_how_many_and_names_trouble_anywhere() -> None:
    facets = {"state": {"READY": 7990, "WEDGED": 3, "FATAL": 7}}
    page = {"total": 8000, "offset": 200, "replicas": [{}] * 200, "facets": facets}
    assert replica_view.showing(page) == "showing 200 of 8000 replicas · rows 201 to 400, page 2 of 40"
    filtered = {"total": 10, "offset": 0, "replicas": [{}] * 10, "facets": facets}
    assert replica_view.showing(filtered) == "showing 10 of 10 matching replicas (8000 in all)"
    assert replica_view.showing({"total": 0, "replicas": [], "facets": {"state": {}}}) == "showing 0 of 0 replicas"
    wedged = {"node": "a", "name": "r0", "state": "WEDGED"}
    stalled = {"node": "b", "name": "r1", "state": "READY", "engine": {"stalled": True}}
    trouble = {"total": 30, "replicas": [wedged]}
    # The fleet's troubled replica (once, though this page shows it too), then this page's stalled engine.
    assert replica_view.attention_lines(trouble, [stalled, wedged]) == [
        "replica a/r0 is WEDGED: out of rotation, canaries fail and no token moves",
        "replica b/r1 has queued work but generates no tokens (stalled engine)",
        "and 29 more replicas BACKOFF, FATAL, UNREACHABLE or WEDGED: filter by state to see them all"]
    assert replica_view.attention_lines(None, []) == []


def test_every_replica_state_has_one_colour() -> None:
    domain, colours = palette.state_scale()
    assert "READY" in domain and len(set(colours)) == len(colours)
    assert palette.state_colour("READY") == "#2e7d32" and palette.state_colour("NEW") == palette.UNKNOWN_COLOUR


def test_latency_charts_draw_each_quantile_and_say_when_there_is_none() -> None:
    samples = [{"at": "2026-11-29T12:00:00+00:00", "values": {"ttft_p50_seconds": 0.05, "ttft_p95_seconds": 0.09,
                                                              "ttft_p99_seconds": 0.12, "itl_p99_seconds": 0.02}},
               {"at": "2026-11-29T12:00:05+00:00", "values": {"ttft_p99_seconds": 0.2, "rss_bytes": 2 * 1024**3}}]
    ttft, itl, e2e, tokens, _queue, memory, gpu_memory = replica_view.replica_charts(samples)
    assert [(p["series"], p["value"]) for p in ttft.points] == [("p50", 50.0), ("p95", 90.0), ("p99", 120.0),
                                                                ("p99", 200.0)]
    assert ttft.quantiles and itl.quantiles and {p["series"] for p in itl.points} == {"p99"}
    assert not e2e.points and e2e.empty.startswith("No end-to-end latency in this window")
    assert not tokens.points and [p["value"] for p in memory.points] == [2048.0] and not gpu_memory.points
    # The quantiles keep their colours from chart to chart; none reads as a replica state.
    domain, colours = palette.quantile_scale()
    assert domain == ["p50", "p95", "p99"] and not set(colours) & set(palette.STATE_COLOURS.values())


def test_a_gpus_temperature_is_drawn_against_its_own_slowdown() -> None:
    samples = [{"at": "2026-11-29T12:00:00+00:00", "values": {"temperature_celsius": 84.0}}]
    hot = replica_view.temperature_chart(1, samples, {"index": 1, "slowdown_temperature_celsius": 87.0})
    assert hot.limit == 87.0 and hot.limit_label == "slowdown 87 °C" and "slows down at 87 °C" in hot.title
    assert [(p["series"], p["value"]) for p in hot.points] == [("GPU 1", 84.0)]
    unknown = replica_view.temperature_chart(1, samples, None)  # no latest reading: no threshold to draw
    assert unknown.limit is None and "reports no slowdown threshold" in unknown.title
    quiet = replica_view.temperature_chart(1, [{"at": "2026-11-29T12:00:00+00:00", "values": {}}], None)
    assert not quiet.points and quiet.empty == "No temperature recorded for GPU 1 in this window."


def test_the_replicas_table_says_each_live_cap_and_whether_the_engine_has_taken_it() -> None:
    def row(limits: dict[str, object] | None) -> str:
        [r] = replica_view.table_rows([{"node": "a", "name": "r0", "model": "m", "state": "READY",
                                        "live_limits": limits}])
        return str(r["live cap"])

    assert row(None) == ""  # live limits off: nothing to say
    assert row({"active": True, "startup_limit": 64, "asked": 16, "cap": 16}) == "16 of 64"
    assert row({"active": True, "startup_limit": 64, "asked": None, "cap": 64}) == "64 of 64"
    # Asked, and the engine has not stepped since (an idle engine takes it with its next request).
    assert row({"active": True, "startup_limit": 64, "asked": 16, "cap": 64}) == "16 of 64 (taking)"
    assert row({"active": False, "reason": "this vLLM's scheduler lacks max_num_active_reqs"}) == (
        "not active: this vLLM's scheduler lacks max_num_active_reqs")
