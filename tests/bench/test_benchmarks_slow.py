"""Each benchmark of issues 4 and 5 in its ``--quick`` mode, end to end: real processes, a JSON result, the figures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_quick(script: str, out: Path, *extra: str, timeout: float = 400) -> dict[str, Any]:
    """Run ``bench/<script> --quick`` and return its JSON document; a failure shows the script's output."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick", "--out", str(out), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    assert "share this host" in doc["note"]  # the output says the load generator competes with the subject
    return doc


@pytest.mark.timeout(420)
@pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                    reason="needs Debian's haproxy")
def test_rolling_restart_drops_nothing_with_drain_and_drops_without(tmp_path: Path) -> None:
    doc = run_quick("rolling_restart.py", tmp_path / "rr.json")
    pitstop = doc["medians"]["pitstop (drain)"]
    # Every replica was restarted in both modes: none held back by the guardrails.
    assert [r["actions"] for r in doc["runs"]] == [["succeeded"] * 3] * 2, doc["runs"]
    assert pitstop["requests"] >= 500
    assert pitstop["failed"] == 0, doc["runs"]
    assert pitstop["min_up"] >= 2, doc["runs"]
    # Each restart came while a longer stream was in flight on that very engine: the drain let every one finish,
    # and the baseline really is a restart without drain: it cut every one.
    pitstop_run, baseline_run = doc["runs"]
    assert [w["ok"] for w in pitstop_run["witnesses"]] == [True] * 3, pitstop_run["witnesses"]
    assert baseline_run["witnesses_cut"] == 3, baseline_run["witnesses"]


@pytest.mark.timeout(420)
# Alone: beside the suite's other tests its stall leg once counted no request lost with the wedged engine. The
# restart came 0.8 s before the agent's WEDGED verdict, so only the gauges counted; why they read none is open.
@pytest.mark.solo
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus and alertmanager")
def test_fault_to_action_pitstop_acts_before_the_stock_pipeline_alerts(tmp_path: Path) -> None:
    doc = run_quick("fault_to_action.py", tmp_path / "f2a.json")
    assert "SHORTENED" in doc["settings"]["baseline"]  # a quick baseline is labelled as not the stock one
    for fault in ("stall", "ttft", "hot"):
        m = doc["medians"][fault]
        assert m["pitstop_action_s"] is not None and m["baseline_s"] is not None, (fault, doc["runs"])
        assert 0 < m["pitstop_action_s"] < m["baseline_s"], (fault, m)
    # The wedged replica is restarted, not only reported; a TTFT breach is a load problem: it pages.
    assert doc["runs"][0]["stall"]["pitstop_action"]["kind"] == "restart"
    assert doc["runs"][0]["ttft"]["pitstop_action"]["kind"] == "alert"
    assert doc["runs"][0]["ttft"]["pitstop_action"]["policy"] == "ttft-slo"
    assert doc["medians"]["stall"]["pitstop_agent_acted_s"] is not None
    # The vLLM-like wedge: the agent takes readiness off before the restart is even recorded, and the replica
    # comes back READY at a new generation.
    stall = doc["medians"]["stall"]
    assert stall["pitstop_ready_off_s"] is not None and stall["pitstop_ready_again_s"] is not None, doc["runs"]
    assert stall["pitstop_ready_off_s"] < stall["pitstop_ready_again_s"]
    # The four streams waiting on the wedged engine: they began before its hang, and the finding counts them.
    run = doc["runs"][0]["stall"]
    assert run["load_lead_s"] > 0 and run["requests_lost"] >= 1, run


@pytest.mark.timeout(300)
def test_leak_is_caught_before_exhaustion_and_flat_memory_never_is(tmp_path: Path) -> None:
    doc = run_quick("leak.py", tmp_path / "leak.json")
    assert 10 < doc["real"]["leak_mib_per_min"] < 25  # the real process leaks about 20 MB/min
    assert abs(doc["real"]["steady_mib_per_min"]) < 2
    run = doc["detection_runs"][0]
    assert run["detected_after_s"] is not None and run["detected_after_s"] <= 11 * 60
    assert run["action"]["kind"] == "planned_restart"
    assert run["restart_due_by_s"] < run["exhaustion_after_s"]
    loop = doc["real_loop"]
    if loop["loop"]:  # a control plane with its policy job: the real leaking replica is restarted in time
        assert loop.get("action") == "planned_restart", loop
        assert loop.get("restarted_after_s") is not None, loop
        assert loop["restarted_after_s"] < loop["exhaustion_after_s"]
    assert doc["false_positives"]["false_positives"] == 0
    assert doc["false_positives"]["evaluations"] > 200


@pytest.mark.timeout(900)
@pytest.mark.solo  # the simulated engines' inter-token latency is what the SLO reads
def test_governor_meets_the_itl_slo_on_real_processes_with_live_caps(tmp_path: Path) -> None:
    # The live arm only: the restarts arm is the benchmark's baseline (bench/README.md), and the governor's
    # restart path is exercised on the store by tests/remediation and on real vLLM by the flag-rung test.
    doc = run_quick("governor.py", tmp_path / "gov.json", "--arms", "live", timeout=880)
    ladder = doc["settings"]["ladder"]
    assert ladder[0] == 256 and ladder[-1] == 16
    [load] = doc["loads"]
    assert [r["max_num_seqs"] for r in load["rows"]] == ladder
    # The sweep, read as the policy reads the agent: 256 misses the (cut) ITL p99 SLO, a lower static value meets
    # it within the governor's throughput limit, and lowering fixes no TTFT.
    assert load["qualifies"] and load["governable"] and load["best_static"] < 256, load
    assert not load["ttft_fixed_by_lowering"]
    real = doc["real"]
    assert "CUT" in real["policies"]  # quick mode cuts for: and the canary window, and says so
    assert real["static"]["throughput"], real
    # The engines run the live-cap plug-in: the governor's steps are live caps (no restart: every replica keeps
    # its generation), and the SLO is met on both replicas to the end. The run lasts until that outcome is in
    # (or its 300 s), however long a busy host takes.
    live = real["governed_live"]
    summary = {k: v for k, v in live.items() if k not in ("series", "actions")}
    capped = [a for a in live["actions"] if a["kind"] == "set_live_cap"]
    assert capped and capped[0]["policy"] == "itl-slo" and capped[0]["max_num_seqs"] < 256, live["actions"]
    assert not [a for a in live["actions"] if a["kind"] in ("lower_max_num_seqs", "restart")], live["actions"]
    assert all(a["kind"] == "alert" for a in live["actions"] if a["policy"] == "ttft-slo")
    assert all(v is not None and v < 256 for v in live["settled_values"].values()), summary
    assert live["slo_first_met_s"] is not None and live["slo_met_s"] is not None, summary
    assert live["throughput_settled"], summary
    # Through HAProxy, from the load's side: nothing failed, and the episode (first action to the SLO met for
    # good) is measured on the requests in flight during it.
    assert live["load"]["requests_failed"] == 0, summary
    assert live["episode"]["requests"] > 0 and live["episode"]["within_slo_share"] is not None, summary


@pytest.mark.timeout(300)
def test_control_plane_benchmark_keeps_up_and_times_its_rounds(tmp_path: Path) -> None:
    doc = run_quick("cp_reports.py", tmp_path / "cp.json")
    [run] = doc["runs"]
    assert run["errors"] == 0 and run["late"] == 0, run
    assert run["reports"] == 150 and run["seeded_samples"] == 50 * 16 * 24  # 2 minutes of history at 5 s
    # The policy process completed rounds while the reports came (the cold one and at least one more: how many
    # fall inside the 15 s measured window depends on the host's load and the duty cap), and the standalone
    # pass saw the whole fleet.
    assert run["server_rounds_total"] >= 2 and run["replicas"] == 400, run
    # A new leader reads the whole window; one interval later it reads only that interval's rows (the times are
    # reported, not compared: at this size evaluation dominates both passes and the host's load decides).
    assert run["cold_rows_read"] >= run["seeded_samples"] > 0, run
    assert 0 < run["warm_rows_read"] < run["cold_rows_read"] / 10, run


@pytest.mark.timeout(420)
def test_cp_failover_the_standby_acts_and_no_report_is_lost(tmp_path: Path) -> None:
    doc = run_quick("cp_reports.py", tmp_path / "fo.json", "--mode", "failover", "--settle", "2", "--after", "1")
    [run] = doc["runs"]
    assert run["standby"] == "warm" and run["reports_acked"] > 100, run
    assert run["reports_lost"] == 0 and run["reports_double"] == 0 and run["agents_with_gaps"] == 0, run
    # The standby took the lock after the kill and then finished a round; every agent reported to it.
    assert 0 < run["kill_to_lock_s"] < run["kill_to_first_round_s"], run
    assert run["agents_current_after_kill_s"] > 0, run


@pytest.mark.timeout(420)
def test_cp_storm_both_retry_modes_bring_every_agent_back(tmp_path: Path) -> None:
    doc = run_quick("cp_reports.py", tmp_path / "storm.json", "--mode", "storm", "--settle", "6", "--down", "5")
    assert [r["retry"] for r in doc["runs"]] == ["fixed", "jitter"]
    for run in doc["runs"]:
        assert run["failed_attempts"] > 0 and run["peak_per_s_after_restart"] > 0, run
        assert run["restart_to_ready_s"] < run["kill_to_all_current_s"], run


@pytest.mark.timeout(420)
# Beside other tests: under four busy loops on two cores Pitstop paged at 6.9 to 9.7 s, the shortened stock
# pipeline at 21.7 to 22.8 s.
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus and alertmanager")
def test_fault_to_page_pitstop_pages_before_the_stock_pipeline(tmp_path: Path) -> None:
    doc = run_quick("fault_to_page.py", tmp_path / "f2p.json")
    assert doc["settings"]["quick"] and "SHORTENED" in doc["settings"]["stock"]  # labelled as not the stock one
    [run] = doc["runs"]
    for fault in ("stall", "ttft", "hot"):
        r = run[fault]
        # PagerDuty got a trigger event carrying the fault's alert, after Pitstop's own record of the fault...
        assert r["pitstop_page_s"] is not None, (fault, run["page_log"])
        assert r["pitstop_action_s"] is not None and 0 < r["pitstop_action_s"] <= r["pitstop_page_s"], (fault, r)
        # ... and before either Prometheus pipeline's webhook, which did deliver.
        assert r["stock_s"] is not None and r["tuned_s"] is not None, (fault, r)
        assert r["pitstop_page_s"] < r["stock_s"] and r["pitstop_page_s"] < r["tuned_s"], (fault, r)
    # The storm: every alert reached the pager and the outbox emptied; one notification per (model, node) group.
    [storm] = doc["storms"]
    assert storm["alerts_carried"] == storm["alerts"] and storm["pending_at_end"] == 0, storm
    assert storm["groups_paged"] == storm["groups_expected"], storm["per_group"]
    assert storm["one_per_group"], (storm["per_group"], storm["queued"])


@pytest.mark.timeout(420)
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_console_scale_times_both_consoles_in_a_real_browser(tmp_path: Path) -> None:
    out = tmp_path / "console.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "console_scale.py"), "--nodes", "20", "--runs", "1",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["replicas"] == 160 and "share this host" in doc["note"]
    # Each page of today's console and the old one-page console became interactive, and was timed.
    assert set(doc["median_seconds"]) == {"new fleet", "new replicas", "old (one page)"}
    assert all(0 < t < 120 for t in doc["median_seconds"].values()), doc["seconds"]


@pytest.mark.timeout(300)
def test_containers_are_measured_beside_processes_on_a_real_podman(tmp_path: Path) -> None:
    doc = run_quick("containers.py", tmp_path / "containers.json")
    assert [r["runtime"] for r in doc["runs"]] == ["process", "container"]
    for runtime in ("process", "container"):
        m = doc["medians"][runtime]
        assert 0 < m["start_to_ready_s"] <= m["all_ready_s"] and m["restart_s"] > 0, (runtime, m)
        assert m["agent_cpu_percent"] >= 0 and m["agent_rss_mb"] > 20, (runtime, m)
    assert doc["runs"][1]["daemon_cpu_percent"] is not None  # Podman's own share, beside the agent's
    assert doc["ratio_container_to_process"]["restart_s"] > 0


@pytest.mark.timeout(300)
def test_a_policy_round_is_timed_and_says_what_it_judged_screened_and_reused(tmp_path: Path) -> None:
    doc = run_quick("policy_round.py", tmp_path / "round.json", "--changed", "0.5")
    [run] = doc["runs"]
    assert run["tree"] == "current" and len(run["rounds"]) == 3 and run["round_s"] > 0, run
    # Each round accounts for every subject of every history condition (50 nodes: 400 replicas and 400 GPUs,
    # 13 shipped conditions): judged, screened by a field or the newest reading, or reused from an earlier round.
    for r in run["rounds"]:
        assert r["judged"] + r["screened"] + r["reused"] == 13 * 400, r
        assert r["screened"] > r["judged"], r  # a calm fleet: most answers told without judging
    # Half the nodes reported between two rounds: the other half's answers were carried over.
    assert all(r["reused"] > 0 for r in run["rounds"][1:]), run["rounds"]
