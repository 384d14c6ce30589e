"""Guardrails in the live loop: breaker trip and reset, dry-run, approval; and a rollout that survives a restart."""

from __future__ import annotations

from pathlib import Path

from tests.controlplane.fixtures import T0, FakeClock
from tests.remediation.fleet import SimAgent, SimReplica, fleet

STALL = """name: stall
condition: {detector: stall, for: 30s}
action: {kind: restart}
guardrails: {cooldown: 10s%s}
"""


def policy_dir(tmp_path: Path, **files: str) -> Path:
    d = tmp_path / "policies"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / f"{name}.yaml").write_text(text)
    return d


def wedge(agent: SimAgent, name: str) -> None:
    r = agent.replica(name)
    r.stalled, r.canary_ok, r.waiting = True, False, 4


def test_failures_trip_the_breaker_until_an_operator_resets_it(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica(f"r{i}") for i in range(3)])
    policies = policy_dir(tmp_path, stall=STALL % "")
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)], action_deadline_seconds=30,
               guardrails={"breaker_max_failures": 2}) as f:
        f.run(30)
        wedge(agent, "r0")  # and the agent never manages to restart it
        f.run(200)
        restarts = [a for a in f.actions(policy="stall") if a["kind"] == "restart"]
        assert [a["state"] for a in restarts if a["state"] == "failed"] == ["failed", "failed"]
        held = [a for a in restarts if a["state"] == "suppressed"]
        assert held and held[0]["guardrails"][0]["guardrail"] == "circuit_breaker"
        assert len(held) == 1, "a refusal repeated every round is recorded once"
        status = f.client.get("/v1/remediation/breaker").json()
        assert status["tripped"] and "failed actions" in status["reason"]
        [page] = f.actions(policy="circuit-breaker")
        assert page["params"]["severity"] == "page"
        # An operator resets it: audited, and automation acts again.
        reset = f.client.post("/v1/remediation/breaker/reset")
        assert reset.status_code == 200 and not reset.json()["tripped"]
        assert any(e["what"] == "breaker.reset" for e in f.client.get("/v1/audit").json())
        f.run(20)
        latest = next(a for a in f.actions(policy="stall") if a["kind"] == "restart")
        assert latest["state"] == "running"


def test_a_dry_run_policy_records_what_it_would_do_and_changes_nothing(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    policies = policy_dir(tmp_path, stall=STALL % ", dry_run: true")
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)]) as f:
        f.run(30)
        wedge(agent, "r0")
        f.run(60)
        rows = f.actions(policy="stall")
        # Shadow records repeat once per cooldown while the condition holds; nothing else is recorded.
        assert {a["state"] for a in rows} <= {"shadow", "suppressed"}
        shadow = next(a for a in rows if a["state"] == "shadow")
        assert shadow["guardrails"][0]["guardrail"] == "dry_run"
        assert shadow["evidence"][0]["detector"] == "stall"
        assert f.client.get("/v1/desired", params={"node": "gpu-a"}).json() == []
        assert agent.replica("r0").generation == 1


def test_an_approval_policy_waits_for_an_operator_then_acts(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    policies = policy_dir(tmp_path, stall=STALL % ", require_approval: true")
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)]) as f:
        f.run(30)
        wedge(agent, "r0")
        f.run(60)
        [waiting] = f.actions(policy="stall")
        assert waiting["state"] == "proposed" and waiting["guardrails"][0]["guardrail"] == "approval"
        f.run(30)
        assert len(f.actions(policy="stall")) == 1, "an open proposal is not proposed again"
        approved = f.client.post(f"/v1/actions/{waiting['id']}/approve")
        assert approved.status_code == 200 and approved.json()["state"] == "running"
        assert approved.json()["approved_by"]
        f.step(10, converge=True)
        f.step(10)
        assert f.action(waiting["id"])["state"] == "succeeded"
        assert agent.replica("r0").generation == 2


ROLLING = """name: ttft-rolling
condition: {signal: ttft_p99_seconds, op: ">", threshold: 0.5, for: 30s}
action: {kind: rolling_restart, batch_size: 1}
"""


def test_a_rolling_restart_goes_one_at_a_time_and_resumes_after_a_control_plane_restart(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica(f"r{i}", ttft=0.9) for i in range(3)])
    policies = policy_dir(tmp_path, rolling=ROLLING)
    settings = {"policy_dirs": [str(policies)], "policy_defaults": False}
    clock = FakeClock(T0)
    with fleet(tmp_path, [agent], clock, **settings) as f:
        f.run(50)
        [rolling] = f.actions(policy="ttft-rolling")
        assert rolling["kind"] == "rolling_restart" and rolling["state"] == "running"
        for r in agent.replicas:
            r.ttft = 0.1
        f.step(10, converge=True)  # the first replica restarts
        assert sorted(r.generation for r in agent.replicas) == [1, 1, 2]
    # The control plane restarts mid-rollout; the progress is in the database.
    with fleet(tmp_path, [agent], clock, **settings) as f:
        generations = []
        for _ in range(8):
            f.step(10, converge=True)
            generations.append(sorted(r.generation for r in agent.replicas))
        assert generations[0] in ([1, 1, 2], [1, 2, 2])
        assert [1, 2, 2] in generations, ("one replica at a time", generations)
        done = f.action(rolling["id"])
        assert done["state"] == "succeeded", done
        assert sorted(r.generation for r in agent.replicas) == [2, 2, 2], "each replica restarted exactly once"
        assert done["params"]["rollout"]["done"] == ["gpu-a/r0", "gpu-a/r1", "gpu-a/r2"]


def test_a_rolling_restart_waits_while_the_budget_would_break(tmp_path: Path) -> None:
    from agent.wire import ReplicaState

    agent = SimAgent("gpu-a", [SimReplica(f"r{i}", ttft=0.9) for i in range(3)])
    policies = policy_dir(tmp_path, rolling=ROLLING)
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)], policy_defaults=False) as f:
        f.run(50)
        [rolling] = f.actions(policy="ttft-rolling")
        for r in agent.replicas:
            r.ttft = 0.1
        agent.replica("r2").state = ReplicaState.BACKOFF  # another replica is down meanwhile
        f.step(10, converge=True)  # r0 restarts and comes back
        f.run(30)
        plan = f.action(rolling["id"])["params"]["rollout"]
        assert "budget needs 2" in plan["waiting"], plan
        assert agent.replica("r1").generation == 1, "r1 must not stop while only r0 serves"
        agent.replica("r2").state = ReplicaState.READY
        for _ in range(5):
            f.step(10, converge=True)
        assert f.action(rolling["id"])["state"] == "succeeded"
