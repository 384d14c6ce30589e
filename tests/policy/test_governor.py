from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.evaluate import evaluate_policy
from controlplane.policy.governor import lower_value, raise_value
from controlplane.policy.loader import load_directory
from tests.policy.series import fleet, healthy, replica

TTFT = next(p for p in load_directory() if p.name == "ttft-slo")
ARGS = ["--model", "/models/llama", "--max-num-seqs"]


def rep(name: str, value: int, history):
    return replica(name=name, args=[*ARGS, str(value)], history=history)


def breaching(value: int, start: float, duration: float, ttft: float = 0.9):
    return healthy(duration, start=start, ttft_p99_seconds=ttft, max_num_seqs=value)


def fine(value: int, start: float, duration: float, ttft: float = 0.2):
    return healthy(duration, start=start, ttft_p99_seconds=ttft, max_num_seqs=value)


def test_steps_follow_the_ladder_or_the_factor_and_respect_min_and_max():
    by_factor = LowerMaxNumSeqsAction(kind="lower_max_num_seqs", factor=0.5, min=8)
    assert lower_value(100, by_factor) == 50
    assert lower_value(12, by_factor) == 8
    assert lower_value(8, by_factor) is None
    assert raise_value(50, by_factor, 256) == 100
    assert raise_value(200, by_factor, 256) == 256
    laddered = LowerMaxNumSeqsAction(kind="lower_max_num_seqs", ladder=[256, 128, 64, 32], min=32)
    assert lower_value(200, laddered) == 128  # off-ladder values snap to the rung below
    assert lower_value(32, laddered) is None
    assert raise_value(64, laddered, 256) == 128


def test_pressure_lowers_one_canary_replica_the_worst_one():
    reps = [rep("r1", 256, fine(256, 0, 300) + breaching(256, 310, 120)),
            rep("r2", 256, fine(256, 0, 300) + breaching(256, 310, 120, ttft=1.4)),
            rep("r3", 256, fine(256, 0, 300) + breaching(256, 310, 120))]
    actions = evaluate_policy(TTFT, fleet(430, reps), fleet(430, reps).now)
    assert len(actions) == 1
    act = actions[0]
    assert act.kind == "lower_max_num_seqs" and act.target.key == "replica:n1/r2"
    assert act.params["max_num_seqs"] == 192 and act.params["previous"] == 256
    assert act.params["engine_args"]["n1/r2"] == ["--model", "/models/llama", "--max-num-seqs", "192"]
    assert "canary on one replica first" in act.reason
    assert act.findings[0].evidence


def test_while_the_canary_proves_itself_nothing_else_moves():
    reps = [rep("r1", 256, breaching(256, 0, 430)),
            rep("r2", 192, breaching(256, 0, 300) + fine(192, 400, 30)),
            rep("r3", 256, breaching(256, 0, 430))]
    snap = fleet(430, reps)
    assert evaluate_policy(TTFT, snap, snap.now) == []


def test_a_proven_canary_value_is_promoted_to_the_other_breaching_replicas():
    reps = [rep("r1", 256, breaching(256, 0, 600)),
            rep("r2", 192, breaching(256, 0, 300) + fine(192, 400, 200)),
            rep("r3", 256, breaching(256, 0, 600))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(TTFT, snap, snap.now)
    assert act.target.key == "model:llama-8b" and act.params["max_num_seqs"] == 192
    assert act.replicas == ["n1/r1", "n1/r3"]
    assert "promote canary value 192" in act.reason


def test_a_canary_still_breaching_goes_deeper_not_another_replica():
    reps = [rep("r1", 256, breaching(256, 0, 600)),
            rep("r2", 192, breaching(256, 0, 300) + breaching(192, 400, 200)),
            rep("r3", 256, breaching(256, 0, 600))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(TTFT, snap, snap.now)
    assert act.target.key == "replica:n1/r2" and act.params["max_num_seqs"] == 128


def test_at_the_floor_the_governor_alerts_instead():
    reps = [rep("r1", 16, breaching(16, 0, 300))]
    snap = fleet(300, reps)
    [act] = evaluate_policy(TTFT, snap, snap.now)
    assert act.kind == "alert" and "floor" in act.reason


def test_raise_waits_for_the_slo_met_with_margin_for_the_longer_duration():
    early = fleet(600, [rep("r1", 128, fine(128, 0, 600)), rep("r2", 128, fine(128, 0, 600))])
    assert evaluate_policy(TTFT, early, early.now) == []  # 10 min of good data < raise.for 15 min
    later = fleet(1000, [rep("r1", 128, fine(128, 0, 1000)), rep("r2", 128, fine(128, 0, 1000))])
    [act] = evaluate_policy(TTFT, later, later.now)
    assert act.kind == "raise_max_num_seqs" and act.params["max_num_seqs"] == 192
    assert act.target.key == "replica:n1/r1"  # one replica at a time


def test_inside_the_dead_band_nothing_moves():
    # Under the 500 ms SLO but above the 350 ms raise margin: neither lower nor raise.
    snap = fleet(3000, [rep("r1", 128, fine(128, 0, 3000, ttft=0.42))])
    assert evaluate_policy(TTFT, snap, snap.now) == []


def test_the_fleet_settles_below_a_value_that_broke_the_slo_recently():
    # 192 broke the SLO 20 minutes ago; 128 has been comfortable since: stay at 128.
    history = breaching(192, 0, 300) + fine(128, 400, 1800)
    snap = fleet(2200, [rep("r1", 128, history)])
    assert evaluate_policy(TTFT, snap, snap.now) == []
    # An hour later the memory has faded and 192 may be tried again.
    history += fine(128, 2210, 3600)
    later = fleet(5810, [rep("r1", 128, history)])
    [act] = evaluate_policy(TTFT, later, later.now)
    assert act.kind == "raise_max_num_seqs" and act.params["max_num_seqs"] == 192


def test_without_canary_every_breaching_replica_is_lowered_on_its_own():
    policy = TTFT.model_copy(update={"action": TTFT.action.model_copy(update={"canary": False})})
    reps = [rep("r1", 256, breaching(256, 0, 300)), rep("r2", 128, breaching(128, 0, 300)),
            rep("r3", 256, fine(256, 0, 300))]
    snap = fleet(300, reps)
    got = [(a.target.key, a.params["max_num_seqs"]) for a in evaluate_policy(policy, snap, snap.now)]
    assert got == [("replica:n1/r1", 192), ("replica:n1/r2", 96)]


def test_engine_without_the_flag_is_taken_at_the_assumed_default():
    snap = fleet(300, [replica("r1", args=["--model", "m"], history=breaching(256, 0, 300))])
    [act] = evaluate_policy(TTFT, snap, snap.now)
    assert act.params["previous"] == 256 and act.params["engine_args"]["n1/r1"] == ["--model", "m",
                                                                                  "--max-num-seqs", "192"]


def test_no_second_canary_while_the_first_one_restarts():
    from agent.wire import ReplicaState

    reps = [rep(f"r{i}", 256, breaching(256, 0, 430)) for i in range(1, 6)]
    reps[1] = replica("r2", args=[*ARGS, "192"], history=breaching(256, 0, 400), state=ReplicaState.WARMING)
    snap = fleet(430, reps)
    assert evaluate_policy(TTFT, snap, snap.now) == []


def test_no_raise_while_a_replica_is_still_proving_its_last_change():
    settled = fine(128, 0, 1200)
    just_raised = fine(128, 0, 1150) + fine(192, 1180, 20)  # 20 s at 192: not yet a minute
    snap = fleet(1200, [rep("r1", 128, settled), rep("r2", 192, just_raised)])
    assert evaluate_policy(TTFT, snap, snap.now) == []
    later = fleet(1260, [rep("r1", 128, fine(128, 0, 1260)), rep("r2", 192, just_raised + fine(192, 1210, 50))])
    [act] = evaluate_policy(TTFT, later, later.now)
    assert act.kind == "raise_max_num_seqs" and act.target.key == "replica:n1/r1"
