"""Closed loop: the governor, the guardrails and a fake executor over simulated time settle the fleet on the
largest --max-num-seqs that meets the SLO, without oscillating."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.wire import ReplicaState
from controlplane.policy.evaluate import evaluate
from controlplane.policy.guardrails import GuardState, Verdict, decide, record
from controlplane.policy.loader import load_directory
from controlplane.policy.snapshot import FleetSnapshot, Node, Replica, ReplicaSample
from tests.policy.series import at

TTFT = [p for p in load_directory() if p.name == "ttft-slo"]
RESTART_SECONDS = 60


@dataclass
class SimReplica:
    name: str
    value: int = 256
    down_until: float = -1.0
    history: list[ReplicaSample] = field(default_factory=list)
    changes: list[tuple[float, int]] = field(default_factory=list)


def ttft(value: int, load: float) -> float:
    """TTFT p99 grows with the batch the engine admits: 256 -> 0.87 s, 128 -> 0.48 s at full load."""
    return 0.1 + 0.003 * value * load


def run(replicas: list[SimReplica], start: float, end: float, load: float, state: GuardState) -> GuardState:
    t = start
    while t <= end:
        for r in replicas:
            if t >= r.down_until:
                r.history.append(ReplicaSample(at=at(t), ttft_p99_seconds=ttft(r.value, load), max_num_seqs=r.value,
                                               requests_running=10.0, generation_tokens_total=t * 100))
        if t % 30 == 0:
            snap = FleetSnapshot(now=at(t), nodes=[Node(name="n1")], replicas=[
                Replica(node="n1", name=r.name, model="m", state=ReplicaState.READY if t >= r.down_until
                        else ReplicaState.STARTING, ready=t >= r.down_until,
                        engine_args=["--max-num-seqs", str(r.value)], history=r.history[-400:]) for r in replicas])
            result = decide(evaluate(TTFT, snap, at(t)), state, snap, at(t), {p.name: p for p in TTFT})
            records = list(state.records)
            for d in result.decisions:
                records.append(record(d, at(t)).model_copy(update={"status": "succeeded"})
                               if d.verdict == Verdict.ALLOWED else record(d, at(t)))
                if d.verdict == Verdict.ALLOWED:
                    # The rollout restarts one replica per step: the first one named.
                    sim = next(r for r in replicas if f"n1/{r.name}" == d.action.replicas[0])
                    sim.value = d.action.params["max_num_seqs"]
                    sim.down_until = t + RESTART_SECONDS
                    sim.changes.append((t, sim.value))
            state = GuardState(records=records[-200:])
        t += 10
    return state


def test_governor_settles_on_the_largest_value_meeting_the_slo_and_follows_the_load():
    replicas = [SimReplica("r1"), SimReplica("r2"), SimReplica("r3")]
    # Full load for an hour: 256 and 192 break the 500 ms SLO, 128 meets it (0.48 s).
    state = run(replicas, 0, 3600, load=1.0, state=GuardState())
    assert [r.value for r in replicas] == [128, 128, 128]
    assert all(len(r.changes) <= 2 for r in replicas), [r.changes for r in replicas]
    canary = min(replicas, key=lambda r: r.changes[0][0])
    others = [r for r in replicas if r is not canary]
    assert all(o.changes[0][0] > canary.changes[0][0] for o in others)  # one replica went first
    assert all(v >= 128 for r in replicas for _, v in r.changes)  # never deeper than needed

    # Load halves: 128 now has margin (0.29 s < 350 ms), so the fleet climbs back, one replica at a time, to
    # 192 (0.39 s: inside the dead band) and stays there: never back and forth.
    before = {r.name: len(r.changes) for r in replicas}
    run(replicas, 3610, 3 * 3600, load=0.5, state=state)
    assert [r.value for r in replicas] == [192, 192, 192]
    assert all(len(r.changes) - before[r.name] == 1 for r in replicas)
