"""The closed loop on the real app (SQLite, fake clock): reports in, actions recorded, desired state out, outcomes.

Each test posts reports the way agents would, runs the leader's policy round and executor, and asserts what an
SRE would look at: the action records (evidence, guardrail decisions, outcome), the desired state the agents
get back, and the alerts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.wire import ReplicaState
from tests.controlplane.fixtures import FakeClock
from tests.remediation.fleet import GIB, SimAgent, SimReplica, fleet


def by_kind(rows: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == kind]


def test_a_stalled_replica_is_restarted_with_its_log_tail_kept_and_succeeds_when_ready(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent]) as f:
        f.run(60)
        assert f.actions() == []  # a healthy fleet: nothing to do
        wedged = agent.replica("r0")
        wedged.stalled, wedged.canary_ok, wedged.waiting = True, False, 4
        wedged.log_tail = ["INFO step 1041", "WARNING EngineCore heartbeat late"]
        f.run(150)
        [restart] = by_kind(f.actions(), "restart")
        assert restart["policy"] == "stall" and restart["target"] == "replica:gpu-a/r0"
        assert restart["state"] == "running"
        assert restart["guardrails"] == [{"verdict": "allowed", "guardrail": None, "reason": ""}]
        evidence = restart["evidence"][0]
        assert evidence["detector"] == "stall" and evidence["evidence"], "the samples that triggered it"
        captured = restart["params"]["captured"]["gpu-a/r0"]
        assert captured["log_tail"][-1] == "WARNING EngineCore heartbeat late"
        assert captured["stack_dump"] is None and captured["stack_dump_note"].startswith("waiting for the agent's")
        # The agent is told: generation 2 for r0, r1 untouched.
        desired = {s["name"]: s for s in f.client.get("/v1/desired", params={"node": "gpu-a"}).json()}
        assert desired["r0"]["generation"] == 2 and "r1" not in desired
        f.step(10, converge=True)
        assert agent.desired is not None
        assert {s.name: s.capture_stack for s in agent.desired.replicas} == {"r0": True}  # dump, then drain
        f.step(10)
        done = f.action(restart["id"])
        assert done["state"] == "succeeded" and done["finished_at"] is not None
        # The agent's dump of the wedged engine is on the action, split into what happened and the stacks.
        kept = done["params"]["captured"]["gpu-a/r0"]
        assert kept["stack_dump_note"].startswith("captured by py-spy 0.4.3 at ")
        assert "wait_for_step (vllm/v1/engine/core.py:412)" in kept["stack_dump"]
        # The ask belongs to generation 2 (the agent acts on it once, at the bump); a later one does not ask.
        answer = f.client.post("/v1/replicas/gpu-a/r0/actions",
                               json={"kind": "set_flags", "engine_args": ["--max-num-seqs", "32"], "force": True})
        assert answer.status_code == 201, answer.text
        f.step(10)
        assert [(s.generation, s.capture_stack) for s in agent.desired.replicas] == [(3, False)]
        # The notify alert went on record, delivery pending for the notifier.
        alerts = f.client.get("/v1/alerts").json()
        assert any(a["labels"]["alertname"] == "pitstop-stall" for a in alerts)


def test_a_restart_that_ends_fatal_fails(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent]) as f:
        f.run(30)
        r0 = agent.replica("r0")
        r0.stalled, r0.canary_ok, r0.waiting = True, False, 4
        f.run(150)
        [restart] = by_kind(f.actions(), "restart")
        r0.state, r0.exit_code, r0.log_tail = ReplicaState.FATAL, 1, ["CUDA error: an illegal memory access"]
        f.step(10)
        failed = f.action(restart["id"])
        assert failed["state"] == "failed" and "FATAL" in failed["outcome"]
        assert failed["params"]["captured"]["gpu-a/r0"]["stack_dump_note"].startswith("no stack dump arrived")
        # FATAL is a crash loop: the crash-loop policy pages with the evidence.
        [page] = [a for a in f.actions(policy="crash-loop") if a["kind"] == "alert"]
        assert page["params"]["severity"] == "page" and page["state"] == "succeeded"


def stuttering(name: str) -> SimReplica:
    """A replica running a full batch of 64 at 250 ms ITL p99: the proportional step predicts 36 -> rung 32."""
    return SimReplica(name, itl=0.25, running=64.0, tokens_per_second=3000.0)


def test_an_itl_breach_lowers_max_num_seqs_on_a_canary_then_rolls_it_to_the_peers(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [stuttering(f"r{i}") for i in range(3)])
    with fleet(tmp_path, [agent], canary_window_seconds=60) as f:
        f.run(90)
        [canary] = by_kind(f.actions(), "lower_max_num_seqs")
        assert canary["policy"] == "itl-slo" and canary["evidence"][0]["evidence"]
        assert canary["params"]["canary"] is True and canary["params"]["max_num_seqs"] == 32
        name = canary["target"].rsplit("/", 1)[1]
        f.step(10, converge=True)
        assert agent.replica(name).engine_args[-2:] == ["--max-num-seqs", "32"]
        # The smaller batch meets the SLO at 75 % of its peers' throughput, and its TTFT doubles as requests
        # queue for a slot: the trade the governor makes, judged on ITL and throughput, not TTFT.
        lowered = agent.replica(name)
        lowered.itl, lowered.running, lowered.tokens_per_second, lowered.ttft = 0.08, 32.0, 2250.0, 0.9
        f.run(80)
        judged = f.action(canary["id"])["params"]["rollout"]
        assert judged["canary_verdict"]["verdict"] == "pass", judged
        assert judged["canary_verdict"]["figures"]["canary_ttft_p99_seconds"] == pytest.approx(0.9)  # not judged
        # The peers follow one at a time: never two restarting together.
        for _ in range(6):
            before = [r.generation for r in agent.replicas]
            f.step(10, converge=True)
            assert sum(r.generation > b for r, b in zip(agent.replicas, before, strict=True)) <= 1
        done = f.action(canary["id"])
        assert done["state"] == "succeeded", done
        assert all(r.engine_args[-2:] == ["--max-num-seqs", "32"] for r in agent.replicas)
        assert len(by_kind(f.actions(), "lower_max_num_seqs")) == 1, "the governor did not race the rollout"


def test_a_live_cap_canary_is_judged_on_its_latencies_within_seconds_and_every_peer_takes_it(tmp_path: Path) -> None:
    # The same breach on engines running the live-cap plug-in: a cap of 32, no restart, judged on the
    # per-token latencies of each scrape window as soon as they decide, well inside the 60 s window.
    replicas = [stuttering(f"r{i}") for i in range(3)]
    for r in replicas:
        r.live, r.windows = True, True
    agent = SimAgent("gpu-a", replicas)
    with fleet(tmp_path, [agent], canary_window_seconds=60) as f:
        f.run(90)
        [canary] = by_kind(f.actions(), "set_live_cap")
        assert canary["params"]["canary"] is True and canary["params"]["live_cap"] == 32
        name = canary["target"].rsplit("/", 1)[1]
        f.step(10, converge=True)
        lowered = agent.replica(name)
        assert lowered.live_cap == 32
        lowered.itl, lowered.running, lowered.tokens_per_second = 0.08, 32.0, 2250.0
        # The cap is seen taken on the next step; the windows after it are the evidence.
        seconds = 0
        while f.action(canary["id"])["params"]["rollout"]["phase"] == "canary" and seconds < 60:
            f.step(5, converge=True)
            seconds += 5
        judged = f.action(canary["id"])["params"]["rollout"]
        assert judged["canary_verdict"]["verdict"] == "pass", judged
        assert judged["canary_verdict"]["reason"].startswith("evidence in"), judged
        assert seconds <= 25, f"judged after {seconds} s"
        f.step(5, converge=True)
        done = f.action(canary["id"])
        assert done["state"] == "succeeded", done
        assert all(r.live_cap == 32 and r.restarts == 0 for r in agent.replicas)


def test_a_canary_worse_than_its_peers_is_rolled_back(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [stuttering(f"r{i}") for i in range(3)])
    with fleet(tmp_path, [agent], canary_window_seconds=60) as f:
        f.run(90)
        [canary] = by_kind(f.actions(), "lower_max_num_seqs")
        name = canary["target"].rsplit("/", 1)[1]
        f.step(10, converge=True)
        agent.replica(name).tokens_per_second = 1200.0  # 60 % below the peers' 3000: more than the 35 % allowed
        f.run(80)
        rolled = f.action(canary["id"])
        assert rolled["state"] == "rolled_back", rolled
        assert "generation_tokens_per_second" in rolled["outcome"] and "allowed -35%" in rolled["outcome"]
        f.step(10, converge=True)
        assert agent.replica(name).engine_args[-2:] == ["--max-num-seqs", "64"]
        assert all(r.engine_args[-2:] == ["--max-num-seqs", "64"] for r in agent.replicas)


def test_sustained_preemptions_lower_max_num_seqs_and_sporadic_ones_do_not(tmp_path: Path) -> None:
    # The agent leaves a zero preemption rate off the wire: the control plane must read it as zero, or three
    # preempting readings in two minutes would look like "preempting in every reading it has".
    sporadic = SimAgent("gpu-a", [SimReplica(f"r{i}", engine_args=["--max-num-seqs", "128"]) for i in range(2)])
    with fleet(tmp_path / "sporadic", [sporadic]) as f:
        for step in range(24):
            for r in sporadic.replicas:
                r.preemptions_per_second = 4.0 if step % 8 == 0 else 0.0
            f.step(10)
        assert by_kind(f.actions(), "lower_max_num_seqs") == []
    steady = SimAgent("gpu-a", [SimReplica(f"r{i}", engine_args=["--max-num-seqs", "128"],
                                           preemptions_per_second=2.5 + i) for i in range(2)])
    with fleet(tmp_path / "steady", [steady]) as f:
        f.run(150)
        [lowered] = by_kind(f.actions(), "lower_max_num_seqs")
        assert lowered["target"] == "replica:gpu-a/r1" and lowered["params"]["max_num_seqs"] == 96
        assert "preemptions_per_second > 1" in lowered["reason"] and lowered["params"]["canary"] is True


def test_a_hot_gpu_raises_an_alert_with_its_temperatures(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0")], temperature=86.0)
    with fleet(tmp_path, [agent]) as f:
        f.run(150)
        rows = f.actions(policy="thermal")
        [alert_action] = [a for a in rows if a["state"] == "succeeded"]
        assert alert_action["kind"] == "alert" and alert_action["target"] == "gpu:gpu-a/0"
        # While it stays hot the policy keeps proposing: held by its cooldown, recorded once, not every round.
        [held] = [a for a in rows if a["state"] == "suppressed"]
        assert held["guardrails"][0]["guardrail"] == "cooldown"
        assert alert_action["evidence"][0]["detector"] == "thermal"
        [alert] = [a for a in f.client.get("/v1/alerts").json() if a["action_id"] == alert_action["id"]]
        assert alert["state"] == "firing" and alert["annotations"]["evidence"]


def test_a_hardware_xid_cordons_the_node_and_pages_until_an_operator_uncordons(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0")])
    with fleet(tmp_path, [agent]) as f:
        f.run(30)
        agent.xid_total, agent.last_xid = 1, 79  # GPU fell off the bus
        f.step(10)
        f.step(10)
        [cordon] = by_kind(f.actions(), "cordon")
        assert cordon["policy"] == "xid-hardware" and cordon["state"] == "succeeded"
        assert agent.desired is not None and agent.desired.cordoned
        assert any(a["params"].get("severity") == "page" for a in by_kind(f.actions(), "alert"))
        answer = f.client.post("/v1/nodes/gpu-a/actions", json={"kind": "uncordon"})
        assert answer.status_code == 201 and answer.json()["state"] == "succeeded"
        f.step(10)
        assert not agent.desired.cordoned


def _rss_leak_policy(tmp_path: Path, limit_bytes: int) -> Path:
    """A policy folder with only an rss-leak policy (10 min window) against ``limit_bytes``."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "rss-leak.yaml").write_text(
        f"name: rss-leak\ncondition: {{detector: leak, resource: rss, min_window: 10m, limit_bytes: {limit_bytes}}}\n"
        "action: {kind: planned_restart, within: 1h}\n")
    return policies


def test_a_steady_rss_leak_schedules_a_planned_restart(tmp_path: Path) -> None:
    policies = _rss_leak_policy(tmp_path, limit_bytes=8589934592)
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)]) as f:
        for _ in range(90):  # 15 minutes, +20 MiB a minute
            agent.replica("r0").rss += 20 * 1024**2 // 6
            f.step(10)
        [planned] = by_kind(f.actions(), "planned_restart")
        assert planned["target"] == "replica:gpu-a/r0"
        # No traffic history from a day ago: no quiet window to wait for, so it runs at once.
        assert "at once" in planned["params"]["schedule"]
        assert planned["state"] in ("running", "succeeded")
        assert planned["evidence"][0]["measured"]["slope_bytes_per_minute"] > 15 * 1024**2
        assert agent.replica("r0").rss > 2 * GIB


def test_the_default_leak_policy_projects_against_the_host_memory_the_agent_reports(tmp_path: Path) -> None:
    # No policy file of our own: the shipped rss-leak policy, with the limit taken from the node's report.
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")], memory_total=16 * GIB)
    with fleet(tmp_path, [agent]) as f:
        for _ in range(90):  # 15 minutes, +20 MiB a minute: 16 GiB is about 11 hours away
            agent.replica("r0").rss += 20 * 1024**2 // 6
            f.step(10)
        [planned] = by_kind(f.actions(), "planned_restart")
        assert planned["target"] == "replica:gpu-a/r0" and planned["policy"] == "rss-leak"
        assert planned["evidence"][0]["measured"]["limit_bytes"] == 16 * GIB


def test_the_default_leak_policy_stays_quiet_without_a_known_limit(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])  # an agent that reports no host memory
    with fleet(tmp_path, [agent]) as f:
        for _ in range(90):
            agent.replica("r0").rss += 20 * 1024**2 // 6
            f.step(10)
        assert by_kind(f.actions(), "planned_restart") == []


def test_a_lone_replica_is_held_by_the_default_disruption_budget(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [stuttering("r0")])
    with fleet(tmp_path, [agent]) as f:
        f.run(90)
        [held] = by_kind(f.actions(), "lower_max_num_seqs")
        assert held["state"] == "suppressed" and held["guardrails"][0]["guardrail"] == "disruption_budget"
        assert agent.replica("r0").generation == 1


def test_a_lone_replica_takes_the_new_value_as_soon_as_it_is_ready(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [stuttering("r0")])
    # The default budget keeps one replica READY: a lone replica may only restart where the budget allows 0.
    with fleet(tmp_path, [agent], guardrails={"budget": {"min_ready": 0, "min_ready_ratio": 0}}) as f:
        f.run(90)
        [lowered] = by_kind(f.actions(), "lower_max_num_seqs")
        f.step(10, converge=True)
        f.step(10)
        done = f.action(lowered["id"])
        assert done["state"] == "succeeded", done
        assert "no peers" in done["params"]["rollout"]["canary_verdict"]["reason"]
        assert agent.replica("r0").engine_args[-2:] == ["--max-num-seqs", "32"]


def test_a_ttft_breach_pages_with_its_evidence_and_changes_no_engine(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica(f"r{i}", ttft=1.8, waiting=30.0) for i in range(2)])
    with fleet(tmp_path, [agent]) as f:
        f.run(90)
        rows = f.actions(policy="ttft-slo")
        assert rows and {a["kind"] for a in rows} == {"alert"}
        # One warning per replica; while TTFT stays high its cooldown holds the repeats.
        sent = [a for a in rows if a["state"] == "succeeded"]
        assert sorted(a["target"] for a in sent) == ["replica:gpu-a/r0", "replica:gpu-a/r1"]
        assert by_kind(f.actions(), "lower_max_num_seqs") == []
        assert all(r.generation == 1 and r.engine_args == ["--max-num-seqs", "64"] for r in agent.replicas)
        alerts = f.client.get("/v1/alerts").json()
        [alert] = [a for a in alerts if a["action_id"] == sent[0]["id"]]
        assert alert["labels"]["severity"] == "warning" and alert["annotations"]["evidence"]
        assert alert["annotations"]["runbook_url"] == "runbooks/ttft-slo.md"


# The fleet's clock starts at each of these: the hour's first and last minute, just before midnight (the
# forecast reads yesterday across the day boundary), a month's and a year's end. Nothing in the planning may
# depend on the wall clock or the date.
EDGE_STARTS = [
    datetime(2026, 11, 30, 7, 44, tzinfo=UTC),
    datetime(2026, 11, 30, 8, 0, tzinfo=UTC),
    datetime(2026, 11, 30, 8, 59, tzinfo=UTC),
    datetime(2026, 11, 30, 0, 0, tzinfo=UTC),
    datetime(2026, 11, 30, 23, 40, tzinfo=UTC),
    datetime(2026, 12, 31, 23, 59, tzinfo=UTC),
]


@pytest.mark.parametrize("start_at", EDGE_STARTS, ids=lambda t: t.strftime("%m-%d_%H%M"))
def test_a_planned_restart_waits_for_yesterdays_quiet_hour_when_there_is_time(tmp_path: Path,
                                                                              start_at: datetime) -> None:
    from controlplane.store.db import make_engine, make_sessionmaker, session_scope
    from controlplane.store.models import NodeSamples
    from controlplane.store.samples import node_row

    policies = _rss_leak_policy(tmp_path, limit_bytes=17179869184)
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    # Only this policy: over the hour the default governor would also raise max-num-seqs on the quiet fleet.
    with fleet(tmp_path, [agent], clock=FakeClock(start_at), policy_dirs=[str(policies)],
               policy_defaults=False) as f:
        start = f.clock()
        sessions = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'pitstop.db'}"))
        with session_scope(sessions) as session:  # yesterday: busy, but quiet 40-50 minutes after this hour
            for minute in range(0, 180):
                rate = 0.5 if 40 <= minute <= 50 else 12.0
                at = start - timedelta(days=1) + timedelta(minutes=minute)
                session.add(NodeSamples(**node_row("gpu-a", at, [("replica", "r0", {"requests_per_second": rate})],
                                                   resolution_seconds=60) or {}))
        for _ in range(90):
            agent.replica("r0").rss += 20 * 1024**2 // 6
            f.step(10)
        [planned] = by_kind(f.actions(), "planned_restart")
        assert "quietest" in planned["params"]["schedule"]
        not_before = planned["params"]["not_before"]
        assert start + timedelta(minutes=35) < datetime.fromisoformat(not_before) < start + timedelta(minutes=56)
        assert planned["state"] == "approved" and agent.replica("r0").generation == 1, "waiting for its slot"
        for _ in range(45):
            f.step(60, converge=True)
        done = f.action(planned["id"])
        assert done["state"] == "succeeded"
        assert datetime.fromisoformat(done["started_at"]) >= datetime.fromisoformat(not_before)
        assert agent.replica("r0").generation == 2
