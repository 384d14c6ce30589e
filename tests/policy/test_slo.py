from controlplane.policy.conditions import ErrorRateCondition, ThresholdCondition
from controlplane.policy.detectors.slo import detect_error_rate, detect_threshold
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
