from controlplane.policy.conditions import ErrorRateCondition, ThresholdCondition
from controlplane.policy.detectors.slo import detect_error_rate, detect_threshold
from controlplane.policy.snapshot import ReplicaSample
from controlplane.policy_files import load_directory
from tests.policy.series import at, healthy, replica

TTFT = ThresholdCondition.model_validate({"signal": "ttft_p99_seconds", "op": ">", "threshold": 0.5, "for": "60s"})


def test_ttft_above_threshold_for_the_whole_duration_fires_with_evidence():
    history = healthy(300) + healthy(120, start=310, ttft_p99_seconds=0.8)
    finding = detect_threshold(TTFT, replica(history=history), at(430))
    assert finding is not None
    assert finding.subject == "n1/r1"
    assert finding.measured["latest"] == 0.8
    assert finding.evidence and all(e.values["ttft_p99_seconds"] == 0.8 for e in finding.evidence)


def test_breach_shorter_than_the_duration_does_not_fire():
    history = healthy(300) + healthy(40, start=310, ttft_p99_seconds=0.8)
    assert detect_threshold(TTFT, replica(history=history), at(350)) is None


def test_one_good_sample_inside_the_window_breaks_the_run():
    history = healthy(300, ttft_p99_seconds=lambda t: 0.3 if t == 270 else 0.9)
    assert detect_threshold(TTFT, replica(history=history), at(300)) is None
    assert detect_threshold(TTFT, replica(history=history), at(340)) is not None  # 280..340 all bad


def test_history_shorter_than_the_duration_is_not_a_breach():
    assert detect_threshold(TTFT, replica(history=healthy(30, ttft_p99_seconds=2.0)), at(30)) is None


def test_stale_history_is_not_a_breach():
    history = healthy(300, ttft_p99_seconds=2.0)
    assert detect_threshold(TTFT, replica(history=history), at(300)) is not None
    assert detect_threshold(TTFT, replica(history=history), at(300 + 600)) is None



# TTFT p99 per 1 s scrape window on a replica whose queue holds 24 streams at --max-num-seqs 4, as stored by the
# control plane (a fault benchmark's run): the queue drains in waves, so a window now and then reads tens of
# milliseconds (the first requests of a wave) between windows of 2.5 to 5 s. None: no first token in the window.
SATURATED = [(0.0, 0.098), (1.0, 0.248), (2.0, 0.497), (3.0, 0.494), (4.0, 0.497), (5.0, 2.478), (6.0, 2.484),
             (7.0, 2.465), (8.0, 2.41), (9.0, 0.996), (10.0, 0.496), (11.0, 0.494), (12.0, 0.747), (13.0, 2.482),
             (14.0, 2.485), (15.0, 2.479), (16.0, 2.482), (17.0, 0.02), (18.0, 0.02), (18.9, 0.02), (20.0, 0.986),
             (21.0, 0.729), (22.0, 2.485), (23.0, 4.8), (24.1, 4.975), (25.0, 4.973), (26.0, 0.04), (27.0, 0.248),
             (28.0, 0.02), (29.0, 0.496), (30.0, None), (31.0, 2.485), (32.0, 2.485), (33.0, 2.485), (34.1, 4.95),
             (35.0, 0.02)]


def shipped_ttft_slo() -> ThresholdCondition:
    cond = {p.name: p for p in load_directory()}["ttft-slo"].condition
    assert isinstance(cond, ThresholdCondition)
    return cond


def test_the_shipped_ttft_slo_fires_on_a_queue_that_drains_in_waves() -> None:
    # The recording is 35 s long: the shipped policy's judgement over a 20 s window of it.
    cond = shipped_ttft_slo().model_copy(update={"for_": 20.0})
    history = healthy(10, interval=1.0, start=-11, ttft_p99_seconds=0.02) + [
        ReplicaSample(at=at(t), ttft_p99_seconds=v, requests_running=4.0, requests_waiting=20.0) for t, v in SATURATED]
    finding = detect_threshold(cond, replica(history=history), at(35.0))
    assert finding is not None and finding.figure("max") > 4.0
    # In every reading, it would never have fired: no 20 s of the waves go without a fast window.
    every = cond.model_copy(update={"min_share": 1.0})
    assert all(detect_threshold(every, replica(history=history), at(t)) is None for t, _ in SATURATED)


def test_the_shipped_ttft_slo_ignores_a_lone_slow_window() -> None:
    # The agent's default 5 s scrape: one window in a minute with a long prompt behind it is not a breach.
    history = healthy(300, interval=5.0, ttft_p99_seconds=lambda t: 2.0 if t == 250 else 0.2)
    assert all(detect_threshold(shipped_ttft_slo(), replica(history=history), at(t)) is None
               for t in range(200, 301, 5))


ERR = ErrorRateCondition.model_validate({"detector": "error_rate", "threshold": 0.001, "for": "5m"})


def test_error_ratio_over_threshold_fires():
    history = healthy(600, requests_per_second=10.0, errors_per_second=0.05)  # 0.5 %
    finding = detect_error_rate(ERR, replica(history=history), at(600))
    assert finding is not None and abs(finding.figure("error_ratio") - 0.005) < 1e-9


def test_error_ratio_under_threshold_is_quiet():
    history = healthy(600, requests_per_second=10.0, errors_per_second=0.005)  # 0.05 %
    assert detect_error_rate(ERR, replica(history=history), at(600)) is None


def test_errors_at_trickle_traffic_are_not_a_rate():
    history = healthy(600, requests_per_second=0.1, errors_per_second=0.01)
    assert detect_error_rate(ERR, replica(history=history), at(600)) is None


def test_a_reporting_gap_inside_the_window_is_not_a_breach():
    # Agent silent for 10 minutes, then two bad samples: nobody saw the minute in between.
    history = healthy(300, ttft_p99_seconds=0.9) + healthy(20, start=900, ttft_p99_seconds=0.9)
    assert detect_threshold(TTFT, replica(history=history), at(920)) is None
