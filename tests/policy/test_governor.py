import dataclasses

from agent.wire import LiveLimits, ReplicaState
from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.engine_args import flags_key
from controlplane.policy.evaluate import evaluate_policy
from controlplane.policy.governor import lower_value, proportional_value, raise_value
from controlplane.policy.snapshot import FlagTrial
from controlplane.policy_files import load_directory
from tests.policy.series import at, fleet, healthy, replica

SHIPPED = next(p for p in load_directory() if p.name == "itl-slo")
# The canary, promotion and raise mechanics, one rung per breach (the ladder step): easy to follow by hand.
ITL = SHIPPED.model_copy(update={"action": SHIPPED.action.model_copy(update={"step": "ladder"})})
ARGS = ["--model", "/models/llama", "--max-num-seqs"]


def rep(name: str, value: int, history):
    return replica(name=name, args=[*ARGS, str(value)], history=history)


def breaching(value: int, start: float, duration: float, itl: float = 0.3, running: float = 12.0, **over):
    return healthy(duration, start=start, itl_p99_seconds=itl, requests_running=running, max_num_seqs=value, **over)


def fine(value: int, start: float, duration: float, itl: float = 0.05, **over):
    return healthy(duration, start=start, itl_p99_seconds=itl, max_num_seqs=value, **over)


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
            rep("r2", 256, fine(256, 0, 300) + breaching(256, 310, 120, itl=0.45)),
            rep("r3", 256, fine(256, 0, 300) + breaching(256, 310, 120))]
    actions = evaluate_policy(ITL, fleet(430, reps), fleet(430, reps).now)
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
    assert evaluate_policy(ITL, snap, snap.now) == []


def test_a_proven_canary_value_is_promoted_to_the_other_breaching_replicas():
    reps = [rep("r1", 256, breaching(256, 0, 600)),
            rep("r2", 192, breaching(256, 0, 300) + fine(192, 400, 200)),
            rep("r3", 256, breaching(256, 0, 600))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.target.key == "model:llama-8b" and act.params["max_num_seqs"] == 192
    assert act.replicas == ["n1/r1", "n1/r3"]
    assert "promote canary value 192" in act.reason


def test_a_canary_still_breaching_goes_deeper_not_another_replica():
    reps = [rep("r1", 256, breaching(256, 0, 600)),
            rep("r2", 192, breaching(256, 0, 300) + breaching(192, 400, 200)),
            rep("r3", 256, breaching(256, 0, 600))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.target.key == "replica:n1/r2" and act.params["max_num_seqs"] == 128


def test_at_the_floor_without_rungs_the_governor_alerts_instead():
    bare = ITL.model_copy(update={"action": ITL.action.model_copy(update={"then": []})})
    reps = [rep("r1", 16, breaching(16, 0, 300))]
    snap = fleet(300, reps)
    [act] = evaluate_policy(bare, snap, snap.now)
    assert act.kind == "alert" and "floor" in act.reason and "no further rung" in act.reason


def flagged(name: str, value: int, history, gpus=(0,), extra=(), generation: int = 1):
    return replica(name=name, args=[*ARGS, str(value), *extra], history=history, gpus=list(gpus),
                   generation=generation)


def test_at_the_floor_a_multi_gpu_replica_gets_the_first_rung_as_a_canary():
    reps = [flagged("r1", 16, breaching(16, 0, 300), gpus=(0, 1)),
            flagged("r2", 16, breaching(16, 0, 300, itl=0.5), gpus=(2, 3))]
    snap = fleet(300, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "add_engine_flag" and act.target.key == "replica:n1/r2"  # the worst one
    assert act.params["flag"] == "--disable-custom-all-reduce" and act.params["value"] is None
    assert act.params["rung"] == 1 and act.params["multi_gpu"] is True
    assert act.params["engine_args"]["n1/r2"] == [*ARGS, "16", "--disable-custom-all-reduce"]
    assert act.params["judge"] == {"latencies": ["itl_p99_seconds"], "max_throughput_drop": 0.35,
                                   "min_latency_gain": 0.05, "baseline": "same_args"}
    assert "floor 16" in act.reason and "rung 1 of 2" in act.reason
    assert act.disruptive and act.replicas == ["n1/r2"]


def test_a_one_gpu_replica_skips_the_multi_gpu_rung_and_a_set_rung_is_not_repeated():
    snap = fleet(300, [flagged("r1", 16, breaching(16, 0, 300))])
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.params["flag"] == "--block-size" and act.params["value"] == "32" and act.params["rung"] == 2
    assert act.params["engine_args"]["n1/r1"] == [*ARGS, "16", "--block-size", "32"]
    # Tensor parallel counts as multi-GPU even when the agent lists one device.
    snap = fleet(300, [flagged("r1", 16, breaching(16, 0, 300), extra=["--tensor-parallel-size", "2"])])
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.params["flag"] == "--disable-custom-all-reduce"
    # Every rung already set: the ladder is spent, and the warning says so.
    snap = fleet(300, [flagged("r1", 16, breaching(16, 0, 300), gpus=(0, 1),
                               extra=["--disable-custom-all-reduce", "--block-size", "32"])])
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "alert" and "already set" in act.reason and "add capacity" in act.reason


def test_a_rung_taken_back_is_not_retried_until_its_retry_after():
    reps = [flagged("r1", 16, breaching(16, 0, 300), gpus=(0, 1))]
    trial = FlagTrial(model="llama-8b", flag="--disable-custom-all-reduce", at=at(100),
                      outcome="rolled_back: canary did not cut itl")
    snap = fleet(300, reps).model_copy(update={"flag_trials": [trial]})
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.params["flag"] == "--block-size"  # the next rung instead
    other_model = trial.model_copy(update={"model": "other"})
    snap = fleet(300, reps).model_copy(update={"flag_trials": [other_model]})
    assert evaluate_policy(ITL, snap, snap.now)[0].params["flag"] == "--disable-custom-all-reduce"
    block = FlagTrial(model="llama-8b", flag="--block-size", value="32", at=at(200), outcome="failed: deadline")
    snap = fleet(300, reps).model_copy(update={"flag_trials": [trial, block]})
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "alert" and "taken back" in act.reason and "not retried for 6h" in act.reason
    later = fleet(300 + 6 * 3600, [flagged("r1", 16, breaching(16, 6 * 3600, 300), gpus=(0, 1))])
    later = later.model_copy(update={"flag_trials": [trial, block]})
    assert evaluate_policy(ITL, later, later.now)[0].params["flag"] == "--disable-custom-all-reduce"


def test_a_rung_waits_for_the_breach_on_the_engine_running_now():
    # r1 restarted into generation 2 (a rung rolled to it) 30 s ago: the breach before it says nothing
    # about the new engine, so the next rung waits until the new engine has breached for the full minute.
    history = breaching(16, 0, 260, generation=1) + breaching(16, 270, 30, generation=2)
    snap = fleet(300, [flagged("r1", 16, history, gpus=(0, 1), generation=2,
                               extra=["--disable-custom-all-reduce"])])
    assert evaluate_policy(ITL, snap, snap.now) == []
    history += breaching(16, 310, 60, generation=2)
    snap = fleet(370, [flagged("r1", 16, history, gpus=(0, 1), generation=2, extra=["--disable-custom-all-reduce"])])
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.params["flag"] == "--block-size"


def test_no_rung_while_a_replica_of_the_model_restarts():
    reps = [flagged("r1", 16, breaching(16, 0, 300), gpus=(0, 1)),
            replica(name="r2", args=[*ARGS, "16"], history=breaching(16, 0, 250), gpus=[2, 3],
                    state=ReplicaState.STARTING)]
    snap = fleet(300, reps)
    assert evaluate_policy(ITL, snap, snap.now) == []


def test_past_the_throughput_limit_the_next_rung_is_tried_instead_of_a_smaller_batch():
    reps = [rep("r1", 256, breaching(256, 0, 600, running=128, generation_tokens_per_second=3000.0)),
            rep("r2", 48, breaching(256, 0, 300, running=128, generation_tokens_per_second=3000.0)
                + breaching(48, 400, 200, itl=0.21, running=48, generation_tokens_per_second=1650.0))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.kind == "add_engine_flag" and act.target.key == "replica:n1/r2"
    assert act.params["flag"] == "--block-size" and "45% below its peers" in act.reason


def test_raise_waits_for_the_slo_met_with_margin_for_the_longer_duration():
    early = fleet(600, [rep("r1", 128, fine(128, 0, 600)), rep("r2", 128, fine(128, 0, 600))])
    assert evaluate_policy(ITL, early, early.now) == []  # 10 min of good data < raise.for 15 min
    later = fleet(1000, [rep("r1", 128, fine(128, 0, 1000)), rep("r2", 128, fine(128, 0, 1000))])
    [act] = evaluate_policy(ITL, later, later.now)
    assert act.kind == "raise_max_num_seqs" and act.params["max_num_seqs"] == 192
    assert act.target.key == "replica:n1/r1"  # one replica at a time


def test_inside_the_dead_band_nothing_moves():
    # Under the 200 ms SLO but above the 140 ms raise margin: neither lower nor raise.
    snap = fleet(3000, [rep("r1", 128, fine(128, 0, 3000, itl=0.17))])
    assert evaluate_policy(ITL, snap, snap.now) == []


def test_the_fleet_settles_below_a_value_that_broke_the_slo_recently():
    # 192 broke the SLO 20 minutes ago; 128 has been comfortable since: stay at 128.
    history = breaching(192, 0, 300) + fine(128, 400, 1800)
    snap = fleet(2200, [rep("r1", 128, history)])
    assert evaluate_policy(ITL, snap, snap.now) == []
    # An hour later the memory has faded and 192 may be tried again.
    history += fine(128, 2210, 3600)
    later = fleet(5810, [rep("r1", 128, history)])
    [act] = evaluate_policy(ITL, later, later.now)
    assert act.kind == "raise_max_num_seqs" and act.params["max_num_seqs"] == 192


def test_without_canary_every_breaching_replica_is_lowered_on_its_own():
    policy = ITL.model_copy(update={"action": ITL.action.model_copy(update={"canary": False})})
    reps = [rep("r1", 256, breaching(256, 0, 300)), rep("r2", 128, breaching(128, 0, 300)),
            rep("r3", 256, fine(256, 0, 300))]
    snap = fleet(300, reps)
    got = [(a.target.key, a.params["max_num_seqs"]) for a in evaluate_policy(policy, snap, snap.now)]
    assert got == [("replica:n1/r1", 192), ("replica:n1/r2", 96)]


def test_engine_without_the_flag_is_taken_at_the_assumed_default():
    snap = fleet(300, [replica("r1", args=["--model", "m"], history=breaching(256, 0, 300))])
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.params["previous"] == 256 and act.params["engine_args"]["n1/r1"] == ["--model", "m",
                                                                                  "--max-num-seqs", "192"]


def test_no_second_canary_while_the_first_one_restarts():
    from agent.wire import ReplicaState

    reps = [rep(f"r{i}", 256, breaching(256, 0, 430)) for i in range(1, 6)]
    reps[1] = replica("r2", args=[*ARGS, "192"], history=breaching(256, 0, 400), state=ReplicaState.WARMING)
    snap = fleet(430, reps)
    assert evaluate_policy(ITL, snap, snap.now) == []


def test_no_raise_while_a_replica_is_still_proving_its_last_change():
    settled = fine(128, 0, 1200)
    just_raised = fine(128, 0, 1150) + fine(192, 1180, 20)  # 20 s at 192: not yet a minute
    snap = fleet(1200, [rep("r1", 128, settled), rep("r2", 192, just_raised)])
    assert evaluate_policy(ITL, snap, snap.now) == []
    later = fleet(1260, [rep("r1", 128, fine(128, 0, 1260)), rep("r2", 192, just_raised + fine(192, 1210, 50))])
    [act] = evaluate_policy(ITL, later, later.now)
    assert act.kind == "raise_max_num_seqs" and act.target.key == "replica:n1/r1"


# -- the proportional step (the shipped itl-slo) ------------------------------------------------------------

def test_proportional_step_jumps_to_the_rung_the_measured_itl_and_batch_predict():
    # 128 sequences running at 300 ms ITL p99: 200 ms x 0.7 headroom predicts a batch of 60 -> rung 48,
    # in one restart instead of 256 -> 192 -> 128 -> 96 -> 64 -> 48 over five canary windows.
    reps = [rep("r1", 256, breaching(256, 0, 120, itl=0.3, running=128)),
            rep("r2", 256, breaching(256, 0, 120, itl=0.3, running=128))]
    snap = fleet(120, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.kind == "lower_max_num_seqs" and act.params["previous"] == 256
    assert act.params["max_num_seqs"] == 48
    assert act.params["judge"] == {"latencies": ["itl_p99_seconds"], "max_throughput_drop": 0.35}


def test_proportional_step_goes_at_least_one_rung_and_never_below_min():
    no_headroom = SHIPPED.model_copy(update={"action": SHIPPED.action.model_copy(update={"headroom": 1.0})})
    just_over = [rep("r1", 256, breaching(256, 0, 120, itl=0.201, running=256))]
    snap = fleet(120, just_over)
    assert evaluate_policy(no_headroom, snap, snap.now)[0].params["max_num_seqs"] == 192  # predicted 255: a rung
    far_over = [rep("r1", 256, breaching(256, 0, 120, itl=5.0, running=256))]
    snap = fleet(120, far_over)
    assert evaluate_policy(SHIPPED, snap, snap.now)[0].params["max_num_seqs"] == 16  # predicted 9: the floor


def test_proportional_step_without_a_running_batch_takes_one_rung():
    snap = fleet(120, [rep("r1", 256, breaching(256, 0, 120, itl=0.6, running=None))])
    assert evaluate_policy(SHIPPED, snap, snap.now)[0].params["max_num_seqs"] == 192


def test_proportional_value_off_ladder_uses_the_prediction_itself():
    by_factor = LowerMaxNumSeqsAction(kind="lower_max_num_seqs", factor=0.5, min=8, step="proportional")
    assert proportional_value(256, by_factor, 70.4) == 70
    assert proportional_value(256, by_factor, 200.0) == 128  # at least one factor step down
    assert proportional_value(16, by_factor, 3.0) == 8


def test_a_canary_still_breaching_is_lowered_again_from_its_own_measurement():
    reps = [rep("r1", 256, breaching(256, 0, 600, running=128)),
            rep("r2", 64, breaching(256, 0, 300, running=128) + breaching(64, 400, 200, itl=0.22, running=64))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.target.key == "replica:n1/r2" and act.params["max_num_seqs"] == 32  # 64 x 0.14 / 0.22 = 41


def test_a_canary_that_lost_too_much_throughput_is_not_lowered_further():
    # r2 at 48 still breaches but makes 55 % of r1's tokens: a smaller batch would cost more than the
    # policy allows (35 %), so the governor warns instead of restarting it again.
    reps = [rep("r1", 256, breaching(256, 0, 600, running=128, generation_tokens_per_second=3000.0)),
            rep("r2", 48, breaching(256, 0, 300, running=128, generation_tokens_per_second=3000.0)
                + breaching(48, 400, 200, itl=0.21, running=48, generation_tokens_per_second=1650.0))]
    snap = fleet(600, reps)
    bare = SHIPPED.model_copy(update={"action": SHIPPED.action.model_copy(update={"then": []})})
    [act] = evaluate_policy(bare, snap, snap.now)
    assert act.kind == "alert" and act.target.key == "replica:n1/r2"
    assert "45% below its peers" in act.reason and "capacity" in act.reason
    # The same replica at 80 % of its peers' throughput is lowered further.
    reps[1] = rep("r2", 48, breaching(256, 0, 300, running=128, generation_tokens_per_second=3000.0)
                  + breaching(48, 400, 200, itl=0.21, running=48, generation_tokens_per_second=2400.0))
    snap = fleet(600, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.kind == "lower_max_num_seqs" and act.params["max_num_seqs"] == 32


def test_a_ttft_breach_alerts_and_leaves_max_num_seqs_alone():
    ttft = next(p for p in load_directory() if p.name == "ttft-slo")
    reps = [rep("r1", 256, healthy(120, ttft_p99_seconds=1.8, requests_waiting=40.0, max_num_seqs=256)),
            rep("r2", 256, healthy(120, ttft_p99_seconds=0.2, max_num_seqs=256))]
    snap = fleet(120, reps)
    [act] = evaluate_policy(ttft, snap, snap.now)
    assert act.kind == "alert" and act.target.key == "replica:n1/r1"
    assert act.params["severity"] == "warning" and act.runbook_url == "runbooks/ttft-slo.md"
    assert act.findings[0].evidence and "ttft_p99_seconds > 0.5" in act.reason
    # And the governor does not act on TTFT: the same fleet is quiet for itl-slo.
    assert evaluate_policy(SHIPPED, snap, snap.now) == []


def test_a_bursty_itl_breaches_on_its_share_of_readings_and_is_modelled_at_its_bursts():
    # Prefill bursts: the per-scrape ITL p99 is 300 ms in one reading of five and 50 ms otherwise.
    def bursty(t: float) -> float:
        return 0.3 if (t // 10) % 5 == 0 else 0.05

    reps = [rep("r1", 256, healthy(120, itl_p99_seconds=bursty, requests_running=128.0, max_num_seqs=256)),
            rep("r2", 256, healthy(120, itl_p99_seconds=bursty, requests_running=128.0, max_num_seqs=256))]
    snap = fleet(120, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert "in 1 of 7 samples" in act.reason
    assert act.params["max_num_seqs"] == 48  # the bursts' 300 ms, not the mean's 100 ms, is what is modelled
    every = SHIPPED.model_copy(update={"condition": SHIPPED.condition.model_copy(update={"min_share": 1.0})})
    assert evaluate_policy(every, snap, snap.now) == []  # "in every reading" never holds on a bursty signal
    calm = [rep("r1", 48, healthy(120, interval=5.0, itl_p99_seconds=lambda t: 0.3 if t == 90 else 0.05,
                                  max_num_seqs=48))]
    snap = fleet(120, calm)
    assert evaluate_policy(SHIPPED, snap, snap.now) == []  # one spike in 13 readings is under the 10 % share


def test_a_surges_first_seconds_do_not_set_the_step():
    # Every stream prefilling at once: 700 ms until t=90, then the steady level: bursts of 300 ms.
    def surge(t: float) -> float:
        return 0.7 if t < 90 else (0.3 if t == 100 else 0.05)

    snap = fleet(120, [rep(r, 256, healthy(120, itl_p99_seconds=surge, requests_running=128.0, max_num_seqs=256))
                       for r in ("r1", "r2")])
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.params["max_num_seqs"] == 48  # from the steady 300 ms: 60; from the surge's 700 ms it would be 16


def test_a_surges_arriving_streams_do_not_set_the_step():
    # The streams still arriving in the window's first half: 32 running, then the steady 128. The step is sized
    # to the batch the replica runs now: from the window's mean (87) it would be 40 -> 32, and that canary lost
    # more throughput than allowed and was rolled back.
    def surge(t: float) -> float:
        return 0.7 if t < 90 else (0.3 if t == 100 else 0.05)

    def arriving(t: float) -> float:
        return 32.0 if t < 90 else 128.0

    snap = fleet(120, [rep(r, 256, healthy(120, itl_p99_seconds=surge, requests_running=arriving,
                                           max_num_seqs=256)) for r in ("r1", "r2")])
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.params["max_num_seqs"] == 48  # 128 * 0.2 * 0.7 / 0.3 = 60


def test_a_surge_that_has_passed_moves_one_rung_not_a_jump_sized_on_it():
    # The load arrived at t=60 with every stream prefilling at once (700 ms), then well under the threshold: the
    # condition's share holds on the surge alone. Sized on 700 ms the step would be 16 (that canary lost 60 % of
    # its peers' throughput and was rolled back); one rung lets the steady breach, if any, size the next.
    def surge(t: float) -> float:
        return 0.7 if 60 <= t < 70 else 0.05

    snap = fleet(120, [rep(r, 256, healthy(120, itl_p99_seconds=surge, requests_running=128.0, max_num_seqs=256))
                       for r in ("r1", "r2")])
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.params["max_num_seqs"] == 192


def test_a_canary_value_that_cost_too_much_throughput_is_not_promoted():
    # r2 meets the SLO at 16 but makes a third of r1's tokens: its judge rolls it back; never promote it.
    reps = [rep("r1", 256, breaching(256, 0, 600, running=128, generation_tokens_per_second=3000.0)),
            rep("r2", 16, breaching(256, 0, 300, running=128, generation_tokens_per_second=3000.0)
                + fine(16, 400, 200, generation_tokens_per_second=1000.0))]
    snap = fleet(600, reps)
    assert [a for a in evaluate_policy(SHIPPED, snap, snap.now) if a.target.key == "model:llama-8b"] == []
    reps[1] = rep("r2", 48, breaching(256, 0, 300, running=128, generation_tokens_per_second=3000.0)
                  + fine(48, 400, 200, generation_tokens_per_second=2200.0))
    snap = fleet(600, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.target.key == "model:llama-8b" and act.params["max_num_seqs"] == 48


def test_nothing_is_proposed_while_a_replica_has_yet_to_take_its_last_change():
    # r1's canary was just rolled back (desired generation 3, still reporting 2 with the flag): a proposal now
    # would be built from arguments that are about to go away.
    reps = [replica(name="r1", args=[*ARGS, "16", "--disable-custom-all-reduce"], history=breaching(16, 0, 300),
                    gpus=[0, 1], generation=2, desired_generation=3),
            flagged("r2", 16, breaching(16, 0, 300), gpus=(2, 3))]
    snap = fleet(300, reps)
    assert evaluate_policy(ITL, snap, snap.now) == []


def test_after_a_rung_helps_the_fleet_raises_max_num_seqs_again_under_the_new_flags():
    # The ladder went 64 -> 32 -> 16 without the flag (every value broke the SLO), then the flag rung fixed
    # it. Those breaches were under other flags, so 20 comfortable minutes later the governor raises again
    # instead of sitting at the floor for the hour it remembers breaches.
    old = flags_key([*ARGS, "16"])
    new = flags_key([*ARGS, "16", "--disable-custom-all-reduce"])
    history = (breaching(64, 0, 120, flags_key=old) + breaching(32, 130, 120, flags_key=old)
               + breaching(16, 260, 120, flags_key=old) + fine(16, 400, 1200, flags_key=new))
    reps = [flagged("r1", 16, history, gpus=(0, 1), extra=["--disable-custom-all-reduce"])]
    snap = fleet(1600, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "raise_max_num_seqs" and act.params["max_num_seqs"] == 32
    assert act.params["engine_args"]["n1/r1"] == [*ARGS[:2], "--disable-custom-all-reduce", "--max-num-seqs", "32"]
    # Under unchanged flags the same history keeps the floor: 32 broke the SLO within the hour.
    same = [flagged("r1", 16, [s for s in history if s.flags_key == old]
                    + [dataclasses.replace(s, flags_key=old) for s in history if s.flags_key == new], gpus=(0, 1))]
    snap = fleet(1600, same)
    assert evaluate_policy(ITL, snap, snap.now) == []


def preempting(value: int, start: float, duration: float, rate: float = 3.0, **over):
    return fine(value, start, duration, preemptions_per_second=rate, kv_cache_usage_ratio=0.99, **over)


def test_preemptions_lower_max_num_seqs_one_rung_at_a_time_even_with_itl_fine():
    reps = [rep("r1", 256, preempting(256, 0, 300)), rep("r2", 256, preempting(256, 0, 300, rate=6.0))]
    snap = fleet(300, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)  # proportional step: but a pressure breach takes one rung
    assert act.kind == "lower_max_num_seqs" and act.target.key == "replica:n1/r2"
    assert act.params["max_num_seqs"] == 192 and "preemptions_per_second > 1" in act.reason
    # Readings over 1/s in under half of the two minutes are no pressure.
    calm = [rep("r1", 256, preempting(256, 0, 300, rate=lambda t: 3.0 if t % 40 == 0 else 0.2))]
    snap = fleet(300, calm)
    assert evaluate_policy(SHIPPED, snap, snap.now) == []


def test_an_itl_breach_picks_the_canary_before_a_preempting_replica():
    reps = [rep("r1", 256, preempting(256, 0, 300, rate=9.0)), rep("r2", 256, breaching(256, 0, 300))]
    snap = fleet(300, reps)
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.target.key == "replica:n1/r2" and "itl_p99_seconds" in act.reason


def test_preemptions_at_the_floor_warn_instead_of_trying_the_latency_rungs():
    snap = fleet(300, [flagged("r1", 16, preempting(16, 0, 300), gpus=(0, 1))])
    [act] = evaluate_policy(SHIPPED, snap, snap.now)
    assert act.kind == "alert" and "floor 16" in act.reason and "KV cache needs room" in act.reason


def test_a_canary_still_preempting_is_not_promoted_and_raising_waits_for_calm_preemptions():
    reps = [rep("r1", 256, preempting(256, 0, 600)),
            rep("r2", 192, preempting(256, 0, 300) + preempting(192, 310, 290))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "lower_max_num_seqs" and act.target.key == "replica:n1/r2" and act.params["max_num_seqs"] == 128
    # ITL comfortably low for 20 minutes, but preemptions at 0.9/s (over 1 x 0.7): no raise.
    busy = [rep("r1", 128, fine(128, 0, 1200, preemptions_per_second=0.9))]
    snap = fleet(1200, busy)
    assert evaluate_policy(ITL, snap, snap.now) == []
    quiet = [rep("r1", 128, fine(128, 0, 1200, preemptions_per_second=0.0))]
    snap = fleet(1200, quiet)
    [up] = evaluate_policy(ITL, snap, snap.now)
    assert up.kind == "raise_max_num_seqs" and up.params["max_num_seqs"] == 192


def test_a_peers_restart_holds_new_lowerings_until_the_load_it_moved_has_settled():
    # r1 took the promoted value 48 eight seconds ago (generation 2); r2's readings over the last minute
    # include the load r1 shed while it restarted: not r2's steady state, so nothing is lowered yet.
    r1_history = fine(48, 0, 590, generation=1) + fine(48, 592, 8, generation=2)
    reps = [replica(name="r1", args=[*ARGS, "48"], history=r1_history, generation=2),
            rep("r2", 48, fine(48, 0, 530) + breaching(48, 540, 60))]
    snap = fleet(600, reps)
    assert evaluate_policy(ITL, snap, snap.now) == []
    # A minute on, r1's new engine has run for the condition's duration: r2's breach is its own now.
    r1_history += fine(48, 610, 60, generation=2)
    reps = [replica(name="r1", args=[*ARGS, "48"], history=r1_history, generation=2),
            rep("r2", 48, fine(48, 0, 530) + breaching(48, 540, 130))]
    snap = fleet(670, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "lower_max_num_seqs" and act.target.key == "replica:n1/r2" and act.params["max_num_seqs"] == 32


def test_a_wedged_peer_is_unavailable_to_the_governor_and_holds_nothing_back():
    # The agent took r3 out of rotation (WEDGED): it serves nothing, so the governor neither waits for it as a
    # peer in flight nor compares throughput against its flat counters; it decides as if r3 were not there.
    working = [rep("r1", 256, fine(256, 0, 300) + breaching(256, 310, 120)),
               rep("r2", 256, fine(256, 0, 300) + breaching(256, 310, 120, itl=0.45))]
    frozen = healthy(430, generation_tokens_total=5000.0, generation_tokens_per_second=0.0, canary_ok=False,
                     itl_p99_seconds=None, max_num_seqs=256)
    wedged = replica(name="r3", args=[*ARGS, "256"], history=frozen, state=ReplicaState.WEDGED,
                     state_since=at(400))
    alone = evaluate_policy(ITL, fleet(430, working), fleet(430, working).now)
    beside = evaluate_policy(ITL, fleet(430, [*working, wedged]), fleet(430, working).now)
    def decided(actions):
        return [(a.kind, a.target.key, a.params["max_num_seqs"]) for a in actions]

    assert decided(beside) == decided(alone) == [("lower_max_num_seqs", "replica:n1/r2", 192)]


def live_rep(name: str, asked: int | None, history, startup: int = 256, active: bool = True):
    """A replica whose engine runs the live-cap plug-in (started at ``startup``), its agent having written ``asked``."""
    limits = LiveLimits(active=active, startup_limit=startup if active else None, asked=asked,
                        cap=(asked or startup) if active else None, reason=None if active else "refused")
    return rep(name, startup, history).model_copy(update={"live_limits": limits, "desired_live_cap": asked})


def capped_at(value: int, samples):
    """Readings taken while the engine ran under a live cap of ``value`` (its --max-num-seqs unchanged)."""
    return [dataclasses.replace(s, live_cap=value) for s in samples]


def test_with_live_limits_the_canary_step_is_a_live_cap_with_no_restart():
    reps = [live_rep("r1", None, fine(256, 0, 300) + breaching(256, 310, 120)),
            live_rep("r2", None, fine(256, 0, 300) + breaching(256, 310, 120, itl=0.45))]
    snap = fleet(430, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "set_live_cap" and act.target.key == "replica:n1/r2"
    assert act.params["live_cap"] == 192 and act.params.get("previous") is None and act.params["canary"] is True
    assert "engine_args" not in act.params  # nothing restarts
    assert "as a live cap (no restart)" in act.reason


def test_a_proven_live_cap_is_promoted_live_and_judged_on_readings_under_the_cap():
    reps = [live_rep("r1", None, breaching(256, 0, 600)),
            live_rep("r2", 192, breaching(256, 0, 300) + capped_at(192, fine(256, 400, 200))),
            live_rep("r3", None, breaching(256, 0, 600))]
    snap = fleet(600, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    assert act.kind == "set_live_cap" and act.target.key == "model:llama-8b"
    assert act.params["live_cap"] == 192 and act.replicas == ["n1/r1", "n1/r3"]


def test_a_cap_not_yet_written_by_the_agent_is_a_change_in_flight():
    reps = [live_rep("r1", None, breaching(256, 0, 600)),
            live_rep("r2", None, breaching(256, 0, 600)).model_copy(update={"desired_live_cap": 192})]
    snap = fleet(600, reps)
    assert evaluate_policy(ITL, snap, snap.now) == []


def test_a_fleet_with_one_replica_without_live_limits_is_stepped_by_restarts():
    reps = [live_rep("r1", None, fine(256, 0, 300) + breaching(256, 310, 120, itl=0.45)),
            live_rep("r2", None, fine(256, 0, 300) + breaching(256, 310, 120), active=False)]
    snap = fleet(430, reps)
    [act] = evaluate_policy(ITL, snap, snap.now)
    # The canary itself could take a live cap: a restart still, since its value would be promoted to r2.
    assert act.kind == "set_live_cap" and act.target.key == "replica:n1/r1"
    promote = fleet(900, [live_rep("r1", 192, fine(256, 0, 300) + capped_at(192, fine(256, 310, 590))),
                          live_rep("r2", None, breaching(256, 0, 900), active=False)])
    [up] = evaluate_policy(ITL, promote, promote.now)
    assert up.kind == "lower_max_num_seqs" and up.params["engine_args"]["n1/r2"][-1] == "192"


def test_raising_past_the_startup_limit_is_a_restart_and_within_it_a_live_cap():
    within = fleet(1000, [live_rep("r1", 128, capped_at(128, fine(256, 0, 1000))),
                          live_rep("r2", 128, capped_at(128, fine(256, 0, 1000)))])
    [act] = evaluate_policy(ITL, within, within.now)
    assert act.kind == "set_live_cap" and act.params["live_cap"] == 192 and act.params["previous"] == 128
    past = fleet(1000, [live_rep("r1", 128, capped_at(128, fine(128, 0, 1000)), startup=128),
                        live_rep("r2", 128, capped_at(128, fine(128, 0, 1000)), startup=128)])
    [act] = evaluate_policy(ITL, past, past.now)
    assert act.kind == "raise_max_num_seqs" and act.params["max_num_seqs"] == 192
