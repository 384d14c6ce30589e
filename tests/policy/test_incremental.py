"""The incremental round proposes exactly what a full evaluation proposes, round after round.

One recorded fleet history (seeded: breaches that start and end, a wedge, crashes, leaks, XIDs, ECC errors, heat,
a node that goes silent, a skewed agent clock, replicas that come and go) is replayed as the store would hold
it at each round's moment; rounds come at uneven times, several between two reports or one after a long gap.
Every round, ``Evaluator.evaluate`` and ``evaluate`` must return the same proposals, figures and evidence
included, and the evaluator must have reused most of its answers (or it saves nothing).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.wire import ReplicaState
from controlplane.policy.evaluate import evaluate
from controlplane.policy.incremental import Evaluator
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction
from controlplane.policy.shards import Part, judged_by_nodes, shard_of
from controlplane.policy.snapshot import FleetSnapshot, Gpu, GpuReading, Node, Replica, ReplicaSample
from controlplane.policy_files import DEFAULTS_DIR, load_directory
from tests.policy.series import GiB, MiB, at

INTERVAL = 5.0
HISTORY = timedelta(minutes=15)

EXTRA = """
- name: rss-leak-fast
  condition: {detector: leak, resource: rss, min_window: 120s, min_samples: 10, horizon: 50m, limit_bytes: 35000000000}
  action: {kind: alert, severity: warning}
- name: queue-slo
  condition: {signal: requests_waiting, op: ">", threshold: 20, for: 30s}
  action: {kind: alert, severity: page}
- name: ttft-share
  condition: {signal: ttft_p99_seconds, op: ">", threshold: 1.0, for: 40s, min_share: 0.5}
  action: {kind: restart}
- name: queue-one-model
  scope: {models: ["model-r1"]}
  condition: {signal: requests_waiting, op: ">", threshold: 20, for: 30s}
  action: {kind: alert, severity: warning}
- name: heat-one-model
  scope: {models: ["model-r1"], nodes: ["n0", "n1", "n2"]}
  condition: {detector: thermal, margin_celsius: 5, for: 1m}
  action: {kind: alert, severity: warning}
- name: ttft-gold
  scope: {labels: {tier: gold}}
  condition: {signal: ttft_p99_seconds, op: ">", threshold: 1.0, for: 20s}
  action: {kind: alert, severity: page}
"""
# n0's replica r1 serves another model for a while: it leaves the model-scoped policies, its GPU with it, then
# comes back.
MOVED = ("n0", "r1")
MOVED_DURING = (400.0, 802.0)


@dataclass
class Subject:
    """One replica's or GPU's recorded readings, by time, and its latest state at each time."""

    node: str
    name: str
    samples: list[ReplicaSample] = field(default_factory=list)
    states: list[tuple[float, ReplicaState, float | None]] = field(default_factory=list)  # (t, state, since)
    readings: list[GpuReading] = field(default_factory=list)


def _record(seed: int, duration: float) -> tuple[list[Subject], list[Subject], dict[str, float]]:
    """A fleet's history: replicas and GPUs on four nodes; node n3 goes silent half way; n2's clock runs 2 s
    ahead; the last replica of n1 appears late."""
    rng = random.Random(seed)
    replicas: list[Subject] = []
    gpus: list[Subject] = []
    silent_from = {"n3": duration / 2}
    for n in range(4):
        node = f"n{n}"
        skew = 2.0 if node == "n2" else 0.0
        for k in range(3):
            subject = Subject(node, f"r{k}")
            start = 200.0 if (node, k) == ("n1", 2) else 0.0
            breach = (rng.uniform(100, 500), rng.uniform(60, 300))  # (from, for how long)
            wedge_at = rng.uniform(300, 700) if rng.random() < 0.3 else None
            leak = rng.random() < 0.4
            crash_at = rng.uniform(200, 800) if rng.random() < 0.2 else None
            tokens = 1000.0
            state: ReplicaState | None = None
            t = start + rng.uniform(0, INTERVAL)
            while t < min(duration, silent_from.get(node, duration)):
                breaching = breach[0] <= t <= breach[0] + breach[1]
                wedged = wedge_at is not None and t >= wedge_at
                crashed = crash_at is not None and t >= crash_at
                if not wedged:
                    tokens += rng.uniform(300, 500) * INTERVAL
                new_state = (ReplicaState.FATAL if crashed else ReplicaState.WEDGED if wedged
                             else ReplicaState.READY)
                if new_state != state:
                    subject.states.append((t, new_state, t))
                    state = new_state
                subject.samples.append(ReplicaSample(
                    at=at(t + skew),
                    ttft_p99_seconds=(1.5 if breaching and rng.random() < 0.7 else 0.2) * rng.uniform(0.9, 1.1),
                    itl_p99_seconds=(0.3 if breaching and rng.random() < 0.5 else 0.03) * rng.uniform(0.9, 1.1),
                    requests_running=12.0, requests_waiting=30.0 if breaching else float(rng.randint(0, 3)),
                    generation_tokens_total=tokens, generation_tokens_per_second=0.0 if wedged else 400.0,
                    requests_per_second=5.0, errors_per_second=0.2 if breaching else 0.0,
                    canary_ok=not wedged, canary_ttft_seconds=0.05,
                    rss_bytes=int(20 * GiB + (t * 200 * MiB / 60 if leak else rng.uniform(0, 50 * MiB))),
                    gpu_memory_bytes=120 * GiB, max_num_seqs=256, generation=1))
                # Reports come every interval, now and then one late or lost.
                t += INTERVAL * rng.choice([1, 1, 1, 1, 2, 0.5])
            replicas.append(subject)
        for index in range(2):
            subject = Subject(node, str(index))
            hot_from = rng.uniform(100, 700)
            xid_at = rng.uniform(0, duration) if rng.random() < 0.5 else None
            ecc_at = rng.uniform(0, duration) if rng.random() < 0.3 else None
            t = rng.uniform(0, INTERVAL)
            while t < min(duration, silent_from.get(node, duration)):
                xid = xid_at is not None and t >= xid_at
                subject.readings.append(GpuReading(
                    at=at(t + skew), temperature_celsius=86.0 if t >= hot_from else 60.0,
                    memory_used_bytes=100 * GiB, xid_events_total=1 if xid else 0,
                    xids=(79,) if xid and t - xid_at < INTERVAL else (),  # type: ignore[operator]
                    ecc_uncorrected_total=2 if ecc_at is not None and t >= ecc_at else 0,
                    throttle_reasons=("thermal",) if t >= hot_from + 100 else ()))
                t += INTERVAL
            gpus.append(subject)
    return replicas, gpus, silent_from


def _snapshot(replicas: list[Subject], gpus: list[Subject], now_s: float) -> FleetSnapshot:
    """The fleet as the store holds it at ``now_s``: samples received by then (a skewed agent's too), the window
    of the history cache, and each replica's latest reported state."""
    now = at(now_s)
    since = now - HISTORY
    out_replicas = []
    last_report: dict[str, float] = {}
    for s in replicas:
        known = [p for p in s.samples if p.at - timedelta(seconds=2 if s.node == "n2" else 0) <= now]
        if not known:
            continue
        last_report[s.node] = max(last_report.get(s.node, 0.0), (known[-1].at - at(0)).total_seconds())
        state, state_since = ReplicaState.READY, None
        for t, st, since_t in s.states:
            if t <= now_s:
                state, state_since = st, since_t
        moved = (s.node, s.name) == MOVED and MOVED_DURING[0] <= now_s < MOVED_DURING[1]
        out_replicas.append(Replica.model_construct(
            node=s.node, name=s.name, model="model-x" if moved else f"model-{s.name}",
            labels={"tier": "gold"} if s.node == "n1" else {}, gpus=[int(s.name[1]) % 2], state=state,
            ready=state == ReplicaState.READY, managed=True,
            state_since=None if state_since is None else at(state_since), engine_args=["--max-num-seqs", "256"],
            generation=1, desired_generation=1, restarts_total=0,
            last_exit_code=137 if state.value == "fatal" else None,
            log_tail=["CUDA out of memory"] if state.value == "fatal" else [],
            history=[p for p in known if p.at >= since], live_limits=None, desired_live_cap=None, engine_kind="vllm"))
    out_gpus = []
    for g in gpus:
        known = [r for r in g.readings if r.at - timedelta(seconds=2 if g.node == "n2" else 0) <= now]
        if not known:
            continue
        latest = known[-1]
        out_gpus.append(Gpu.model_construct(
            node=g.node, index=int(g.name), uuid=f"GPU-{g.node}-{g.name}", name="H200",
            slowdown_temperature_celsius=89.0, memory_used_bytes=latest.memory_used_bytes,
            memory_total_bytes=141 * GiB, throttle_reasons=list(latest.throttle_reasons),
            xid_events_total=latest.xid_events_total or 0, last_xid=79 if latest.xid_events_total else None,
            history=[r for r in known if r.at >= since]))
    nodes = [Node.model_construct(name=f"n{n}", cordoned=False, cordoned_gpus=[], memory_total_bytes=512 * GiB,
                                  last_report_at=at(last_report[f"n{n}"]) if f"n{n}" in last_report else None)
             for n in range(4)]
    return FleetSnapshot.model_construct(now=now, nodes=nodes, gpus=out_gpus, replicas=out_replicas, flag_trials=[],
                                         external_alerts=[], reports_since=at(0), ready_floors={})


def _policies(tmp_path: Path) -> list[Policy]:
    (tmp_path / "extra.yaml").write_text(EXTRA)
    return load_directory(DEFAULTS_DIR) + load_directory(tmp_path)


class _Kept:
    """Snapshots that keep a node's objects from the round before while every one of them (the node, its replicas
    and GPUs, histories included) is unchanged, and build the whole node afresh otherwise: what the leader's
    ``FleetRows`` hands the rounds."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, ...]] = {}

    def __call__(self, snapshot: FleetSnapshot) -> FleetSnapshot:
        def fields(o: Any) -> list[Any]:
            return [getattr(o, f) for f in type(o).model_fields]

        members: dict[str, list[Any]] = {n.name: [n] for n in snapshot.nodes}
        for subject in [*snapshot.replicas, *snapshot.gpus]:
            members[subject.node].append(subject)
        kept: dict[int, Any] = {}
        for name, objects in members.items():
            last = self._last.get(name)
            if last is not None and len(last) == len(objects) and all(
                    fields(a) == fields(b) for a, b in zip(last, objects, strict=True)):
                kept.update({id(new): old for new, old in zip(objects, last, strict=True)})
            else:
                self._last[name] = tuple(objects)
        swap = [lambda o: kept.get(id(o), o)][0]
        return snapshot.model_copy(update={"nodes": [swap(n) for n in snapshot.nodes],
                                           "replicas": [swap(r) for r in snapshot.replicas],
                                           "gpus": [swap(g) for g in snapshot.gpus]})


@pytest.mark.parametrize(("keep", "whole_walk_share"), [(False, 0.75), (True, 0.75), (True, 1.0)],
                         ids=["fresh-objects", "kept-objects", "kept-objects-never-walked-whole"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_round_proposes_what_a_full_evaluation_proposes(tmp_path: Path, seed: int, keep: bool,
                                                              whole_walk_share: float) -> None:
    policies = _policies(tmp_path)
    replicas, gpus, _ = _record(seed, duration=1200.0)
    rng = random.Random(seed * 7)
    # A share of 1: the changed subjects alone are walked however many changed (this small fleet often crosses
    # the default share, which then walks every subject).
    evaluator = Evaluator(whole_walk_share=whole_walk_share)
    kept = _Kept()
    now_s, rounds, kinds, judged, reused, screened, walked, pairs, gap = 1.0, 0, set(), 0, 0, 0, 0, 0, 0.0
    while now_s < 1200.0:
        snapshot = _snapshot(replicas, gpus, now_s)
        proposed = evaluate(policies, snapshot, snapshot.now)
        full = [a.model_dump() for a in proposed]
        looked = kept(snapshot) if keep else snapshot
        incremental = [a.model_dump() for a in evaluator.evaluate(policies, looked, snapshot.now)]
        assert incremental == full, f"round at {now_s:.2f} s differs"
        kinds |= {(a.policy, a.kind) for a in proposed}
        judged += evaluator.judged
        reused += evaluator.reused
        screened += evaluator.screened
        if 0 < gap <= 0.5:  # a round soon after the one before: few nodes reported in between
            walked += evaluator.walked
            pairs += evaluator.judged + evaluator.reused + evaluator.screened
        rounds += 1
        # Rounds at uneven times: quick ones between reports, and now and then a long gap.
        gap = rng.choice([0.25, 0.5, 1.0, 1.7, 2.5, 5.0, 5.0, 12.0, 45.0])
        now_s += gap
    # The history made every kind of detector speak at least once, or the comparison proved little.
    policies_seen = {p for p, _ in kinds}
    assert {"ttft-slo", "stall", "crash-loop", "thermal", "rss-leak-fast", "queue-slo", "ttft-share",
            "node-unreachable", "itl-slo", "queue-one-model", "heat-one-model", "ttft-gold"} <= policies_seen, \
        policies_seen  # itl-slo: the governor
    assert rounds > 100
    # Answers carried over from earlier rounds, and answers told by a field or the newest reading: together over a
    # third of every answer (as the carried-over ones alone were before screens), and each kind saves work, or the
    # round is a full evaluation with extra steps.
    assert reused + screened > (judged + reused + screened) / 3, (judged, reused, screened)
    assert reused > judged / 3 and screened > judged / 3, (judged, reused, screened)
    # With a node's unchanged objects kept, a round soon after the last walks only what changed, fell due, was found
    # or was judged last round (about half of this small, eventful fleet). Built afresh, every object is new and
    # every pair is looked at.
    if keep:
        assert walked < pairs * 2 / 3, (walked, pairs)
    else:
        assert walked >= pairs, (walked, pairs)


class _KeptEach:
    """Snapshots that keep each node, replica and GPU from the round before while its own fields are unchanged:
    a GPU can then stay the very object it was while the replica on it changes model."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], Any] = {}

    def __call__(self, snapshot: FleetSnapshot) -> FleetSnapshot:
        def swap(kind: str, o: Any) -> Any:
            last = self._last.get((kind, o.key if kind != "node" else o.name))
            if last is not None and all(getattr(last, f) == getattr(o, f) for f in type(o).model_fields):
                return last
            self._last[(kind, o.key if kind != "node" else o.name)] = o
            return o

        return snapshot.model_copy(update={"nodes": [swap("node", n) for n in snapshot.nodes],
                                           "replicas": [swap("replica", r) for r in snapshot.replicas],
                                           "gpus": [swap("gpu", g) for g in snapshot.gpus]})


def test_a_gpu_follows_the_replica_on_it_out_of_a_scope_and_back(tmp_path: Path) -> None:
    """n0's GPU 1 is in ``heat-one-model``'s scope while model-r1 runs on it: when its replica moves to another
    model and back, the GPU leaves and re-enters the scope though its own readings did not change."""
    policies = _policies(tmp_path)
    replicas, gpus, _ = _record(1, duration=1200.0)
    evaluator = Evaluator(whole_walk_share=1.0)
    kept = _KeptEach()
    # Rounds every half second around the two moves (the rounds in between would add time, not cases).
    start, end = MOVED_DURING
    times = [t / 2 for t in range(int(start - 30) * 2, int(start + 30) * 2)]
    times += [t / 2 for t in range(int(end - 30) * 2, int(end + 30) * 2)]
    heat, gpu = {}, {}
    for now_s in times:
        snapshot = kept(_snapshot(replicas, gpus, now_s))
        full = [a.model_dump() for a in evaluate(policies, snapshot, snapshot.now)]
        incremental = [a.model_dump() for a in evaluator.evaluate(policies, snapshot, snapshot.now)]
        assert incremental == full, f"round at {now_s:.2f} s differs"
        heat[now_s] = any(a["policy"] == "heat-one-model" and a["target"]["node"] == "n0" for a in full)
        gpu[now_s] = next(g for g in snapshot.gpus if g.key == "n0/1")
    # Hot and in scope before the move, out of scope while moved, in again on its return (the heat has lasted).
    assert heat[start - 0.5] and not heat[start] and not heat[end - 0.5] and heat[end], heat
    # It came back as the very object it was: nothing of its own told the evaluator to look at it again.
    assert gpu[end] is gpu[end - 0.5]


def test_a_changed_policy_is_judged_afresh(tmp_path: Path) -> None:
    policies = _policies(tmp_path)
    replicas, gpus, _ = _record(4, duration=300.0)
    evaluator = Evaluator()
    snapshot = _snapshot(replicas, gpus, 250.0)
    evaluator.evaluate(policies, snapshot, snapshot.now)
    stricter = [p.model_copy(update={"condition": p.condition.model_copy(update={"threshold": 0.0})})
                if p.name == "queue-slo" else p for p in policies]
    later = _snapshot(replicas, gpus, 250.5)
    assert ([a.model_dump() for a in evaluator.evaluate(stricter, later, later.now)]
            == [a.model_dump() for a in evaluate(stricter, later, later.now)])
    assert any(a.policy == "queue-slo" for a in evaluate(stricter, later, later.now))


def _sorted(actions: list[ProposedAction]) -> list[str]:
    return sorted(json.dumps(a.model_dump(mode="json"), sort_keys=True) for a in actions)


@pytest.mark.parametrize("seed", [5, 6])
def test_shards_spread_over_control_planes_propose_together_what_one_whole_round_does(tmp_path: Path,
                                                                                        seed: int) -> None:
    """Three control planes hold three model shards and the node shard between them; half way, shards move (a
    control plane stopped, another took over). Every round, what they propose together is what one round over
    the whole fleet proposes: nothing lost, nothing proposed twice."""
    policies = _policies(tmp_path)
    replicas, gpus, _ = _record(seed, duration=900.0)
    count = 3
    before = [Part.of(count, {0, count}), Part.of(count, {1}), Part.of(count, {2})]
    after = [Part.of(count, {count}), Part.of(count, {0, 1}), Part.of(count, {2})]
    evaluators = [Evaluator() for _ in before]
    models = {f"model-{s.name}" for s in replicas}
    assert {shard_of(m, count) for m in models} == set(range(count)), "every model shard has replicas"
    now_s, rounds, spoken = 1.0, 0, set()
    rng = random.Random(seed)
    while now_s < 900.0:
        snapshot = _snapshot(replicas, gpus, now_s)
        parts = before if now_s < 450.0 else after
        whole = evaluate(policies, snapshot, snapshot.now)
        spread = [a for part, ev in zip(parts, evaluators, strict=True)
                  for a in ev.evaluate(policies, snapshot, snapshot.now, part)]
        assert _sorted(spread) == _sorted(whole), f"round at {now_s:.2f} s differs"
        for part in parts:  # the pure evaluation of a part agrees with its incremental one
            mine = [a for a in whole if (a.model is not None and not judged_by_nodes(_named(policies, a.policy))
                                         and part.owns_model(a.model))
                    or (judged_by_nodes(_named(policies, a.policy)) and part.nodes)]
            assert _sorted(evaluate(policies, snapshot, snapshot.now, part)) == _sorted(mine)
        spoken |= {a.policy for a in whole}
        rounds += 1
        now_s += rng.choice([0.5, 2.5, 5.0, 5.0, 12.0])
    assert {"node-unreachable", "queue-slo", "crash-loop", "ecc-uncorrected", "itl-slo"} <= spoken, sorted(spoken)
    assert rounds > 80


def _named(policies: list[Policy], name: str) -> Policy:
    return next(p for p in policies if p.name == name)


def test_a_leak_whose_time_to_the_limit_enters_the_horizon_between_two_reports_is_found_then(tmp_path: Path) -> None:
    """Time alone brings a steady leak within its horizon: the round after that moment finds it, though no
    sample came since the one before (``leak_due``)."""
    policies = [p for p in _policies(tmp_path) if p.name == "rss-leak-fast"]
    leaky = Subject("n0", "r0")
    for step in range(240):
        t = step * INTERVAL
        leaky.samples.append(ReplicaSample(
            at=at(t), requests_running=12.0, requests_waiting=0.0, generation_tokens_total=1000.0 + 2000 * step,
            generation_tokens_per_second=400.0, requests_per_second=5.0, canary_ok=True,
            rss_bytes=int(20 * GiB + t * 200 * MiB / 60), gpu_memory_bytes=120 * GiB, max_num_seqs=256,
            generation=1))
    evaluator = Evaluator()
    first_found: float | None = None
    now_s = 100.0
    while now_s < 1150.0:
        snapshot = _snapshot([leaky], [], now_s)
        whole = [a.model_dump() for a in evaluate(policies, snapshot, snapshot.now)]
        assert [a.model_dump() for a in evaluator.evaluate(policies, snapshot, snapshot.now)] == whole, now_s
        if whole and first_found is None:
            first_found = now_s
        now_s += 0.25
    assert first_found is not None, "the leak came within its horizon during the replay"
    assert first_found % INTERVAL != 0, "found between two reports, by time alone"
