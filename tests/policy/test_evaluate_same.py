"""Whole fleets through ``evaluate``: a model of many replicas reads each history once per round, so these pin what
the shortcuts must keep deciding (the raise path's memory of breaches, live caps and flag rungs in a history,
missing readings, reporting gaps, leaks with gaps in their series, XID and ECC baselines)."""

from __future__ import annotations

import dataclasses
import math

from agent.wire import LiveLimits
from controlplane.policy.conditions import LeakCondition
from controlplane.policy.detectors.ecc import ecc_increase
from controlplane.policy.detectors.leak import detect_leak
from controlplane.policy.detectors.xid import new_xids
from controlplane.policy.engine_args import flags_key
from controlplane.policy.evaluate import evaluate, evaluate_policy
from controlplane.policy.memory import breach_ceiling
from controlplane.policy.snapshot import GpuReading, Replica, ReplicaSample
from controlplane.policy_files import load_directory
from tests.policy.series import GiB, MiB, at, fleet, gpu, gpu_readings, healthy, replica

SHIPPED = load_directory()
ITL = next(p for p in SHIPPED if p.name == "itl-slo")
LADDER = ITL.model_copy(update={"action": ITL.action.model_copy(update={"step": "ladder"})})
ARGS = ["--model", "/models/llama", "--max-num-seqs"]
NOW = 1500.0


def fine(value: int, start: float, duration: float, **over) -> list[ReplicaSample]:
    return healthy(duration, start=start, itl_p99_seconds=0.05, max_num_seqs=value, **over)


def breaching(value: int, start: float, duration: float, **over) -> list[ReplicaSample]:
    return healthy(duration, start=start, itl_p99_seconds=0.3, max_num_seqs=value, **over)


def rep(name: str, value: int, history: list[ReplicaSample], extra: tuple[str, ...] = ()) -> Replica:
    return replica(name=name, args=[*ARGS, str(value), *extra], history=history)


def calm_model(count: int, lowest: int = 96) -> list[Replica]:
    """``count`` replicas comfortable for the whole history, every fourth at ``lowest``, the others at 128."""
    return [rep(f"r{i:02d}", lowest if i % 4 == 1 else 128, fine(lowest if i % 4 == 1 else 128, 0, NOW))
            for i in range(count)]


def test_a_calm_model_raises_its_lowest_replica_first_and_never_back_to_a_value_that_broke():
    # r40 broke the SLO at 256 twenty minutes ago, then ran comfortably at 96: nobody goes back to 256.
    reps = [*calm_model(40), rep("r40", 96, breaching(256, 0, 300) + fine(96, 310, NOW - 310))]
    snap = fleet(NOW, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "raise_max_num_seqs" and act.target.key == "replica:n1/r01"
    assert act.params["max_num_seqs"] == 128 and act.params["previous"] == 96
    assert "never back to 256" in act.reason
    [finding] = act.findings
    assert finding.measured == {"ceiling": 256} and len(finding.evidence) == 12
    assert breach_ceiling(reps, [ITL.condition, *ITL.action.pressure], 3600.0, snap.now) == 256


def test_a_value_that_broke_lately_holds_the_replicas_below_it():
    # 192 broke within the hour on r12, now at 128: 96 -> 128 may go, 128 -> 192 may not.
    reps = [*calm_model(12), rep("r12", 128, breaching(192, 0, 300) + fine(128, 310, NOW - 310))]
    snap = fleet(NOW, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "raise_max_num_seqs" and act.target.key == "replica:n1/r01"
    assert act.params["max_num_seqs"] == 128 and act.findings[0].measured == {"ceiling": 192}
    # With no replica below 128 the model has settled.
    reps = [rep(f"r{i:02d}", 128, fine(128, 0, NOW)) for i in range(12)] + reps[-1:]
    assert evaluate_policy(ITL, fleet(NOW, reps), at(NOW)) == []


def test_one_breach_anywhere_in_a_calm_model_lowers_instead_of_raising():
    reps = [rep(f"r{i:02d}", 128, fine(128, 0, NOW)) for i in range(30)]
    reps.append(rep("r30", 128, fine(128, 0, NOW - 300) + breaching(128, NOW - 290, 290)))
    snap = fleet(NOW, reps)
    [act] = evaluate_policy(LADDER, snap, snap.now)
    assert act.kind == "lower_max_num_seqs" and act.target.key == "replica:n1/r30"
    assert act.params["max_num_seqs"] == 96


def test_readings_under_a_live_cap_are_the_values_read_and_older_flags_are_forgotten():
    limits = LiveLimits(active=True, startup_limit=256, asked=128, cap=128)
    capped = [dataclasses.replace(s, live_cap=128) for s in fine(256, 310, NOW - 310)]
    live = rep("r0", 256, breaching(256, 0, 300) + capped).model_copy(
        update={"live_limits": limits, "desired_live_cap": 128})
    [act] = evaluate_policy(ITL, fleet(NOW, [live]), at(NOW))
    assert act.kind == "set_live_cap" and act.params["live_cap"] == 192 and act.params["previous"] == 128
    assert "never back to 256" in act.reason
    # The same breach under flags the replica no longer runs says nothing about its value now.
    rung = "--disable-custom-all-reduce"
    before, after = flags_key([*ARGS, "128"]), flags_key([*ARGS, "128", rung])
    history = breaching(128, 0, 300, flags_key=before) + fine(128, 310, NOW - 310, flags_key=after)
    [act] = evaluate_policy(ITL, fleet(NOW, [rep("r0", 128, history, (rung,))]), at(NOW))
    assert act.kind == "raise_max_num_seqs" and act.findings[0].measured == {"ceiling": None}


def test_bursts_under_the_share_do_not_breach_and_keep_the_replica_from_going_up():
    # One reading in 40 over 200 ms: under the 10 % a breach needs in any minute.
    bursty = healthy(NOW, 5.0, itl_p99_seconds=lambda t: 0.3 if t % 200 == 0 else 0.05, max_num_seqs=128)
    assert evaluate_policy(ITL, fleet(NOW, [rep("r0", 128, bursty)]), at(NOW)) == []
    # Comfortable for the last quarter of an hour: up it goes, the bursts being no breach to remember.
    calmer = healthy(NOW, 5.0, itl_p99_seconds=lambda t: 0.3 if t % 200 == 0 and t < 500 else 0.05,
                     max_num_seqs=128)
    [act] = evaluate_policy(ITL, fleet(NOW, [rep("r0", 128, calmer)]), at(NOW))
    assert act.kind == "raise_max_num_seqs" and act.findings[0].measured == {"ceiling": None}


def test_a_missing_or_unreadable_reading_is_not_a_comfortable_one():
    for odd in (None, math.nan):
        history = healthy(NOW, max_num_seqs=128, itl_p99_seconds=lambda t, odd=odd: odd if t == NOW - 300 else 0.05)
        assert evaluate_policy(ITL, fleet(NOW, [rep("r0", 128, history)]), at(NOW)) == []


def test_a_reporting_gap_inside_the_raise_window_holds_the_raise_back():
    def with_gap(gap: float) -> list[ReplicaSample]:
        return fine(128, 0, 900) + fine(128, 900 + gap, NOW - 900 - gap)

    # A gap of 180 s is still a covered window; one longer is a stretch nobody saw.
    [act] = evaluate_policy(ITL, fleet(NOW, [rep("r0", 128, with_gap(180.0))]), at(NOW))
    assert act.kind == "raise_max_num_seqs"
    assert evaluate_policy(ITL, fleet(NOW, [rep("r0", 128, with_gap(190.0))]), at(NOW)) == []


def test_leaks_are_found_with_or_without_gaps_in_their_series_and_flat_memory_is_not():
    cond = LeakCondition.model_validate({"detector": "leak", "resource": "rss", "limit_bytes": 64 * GiB})
    rising = healthy(3600, rss_bytes=lambda t: int(44 * GiB + 50 * MiB * t / 60))
    holey = [dataclasses.replace(s, rss_bytes=None) if i % 7 == 3 else s for i, s in enumerate(rising)]
    flat = healthy(3600, rss_bytes=lambda t: int(44 * GiB + (MiB if t % 20 else 0)))
    for history, found in ((rising, True), (holey, True), (flat, False)):
        r = replica(history=history)
        finding = detect_leak(cond, r, fleet(3600, [r]), at(3600))
        assert (finding is not None) == found
        if finding is not None:
            assert 45 * MiB < finding.figure("slope_bytes_per_minute") < 55 * MiB


def test_xid_and_ecc_counts_start_from_the_last_reading_before_the_window():
    readings = gpu_readings(3600, interval=30, xid_events_total=lambda t: 1 if t < 3000 else 3,
                            ecc_uncorrected_total=lambda t: 5 if t < 3000 else (6 if t < 3300 else 1))
    g = gpu(history=readings, xid_events_total=3, last_xid=79)
    assert new_xids(g, at(3600), 900) == 2
    assert ecc_increase(readings, at(3600), 900) == 2  # 5 -> 6, then a reset: 1 counted from zero
    # A window longer than the history counts the whole counter, as after an agent start.
    assert new_xids(g, at(3600), 7200) == 3
    # The shipped policies act on both: the node cordoned for the hardware XID, the GPU for its ECC errors.
    snap = fleet(3600, [replica(gpus=[0])], [g])
    acted = {(a.policy, a.kind, a.target.key) for a in evaluate(SHIPPED, snap, snap.now)}
    assert {("xid-hardware", "cordon", "node:n1"), ("ecc-uncorrected", "cordon", "gpu:n1/0")} <= acted
    late = [*readings, GpuReading(at=at(3700), xid_events_total=9, xids=(13,))]
    assert new_xids(gpu(history=late, xid_events_total=3), at(3600), 900) == 2  # a reading after now is not read
