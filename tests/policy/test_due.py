"""``for:`` counts from the first crossing sample: the rounds know the moment a breach under way is met."""

from __future__ import annotations

from agent.wire import ReplicaState
from controlplane.policy.conditions import StallCondition, ThermalCondition, ThresholdCondition
from controlplane.policy.detectors.slo import detect_threshold
from controlplane.policy.detectors.stall import detect_stall
from controlplane.policy.detectors.thermal import detect_thermal
from controlplane.policy.due import DUE_SLACK_SECONDS, next_due, wait_seconds
from controlplane.policy.evaluate import evaluate
from controlplane.policy.policy import Policy
from controlplane.policy.snapshot import ReplicaSample
from tests.policy.series import at, fleet, gpu, gpu_readings, healthy, replica

TTFT = ThresholdCondition.model_validate({"signal": "ttft_p99_seconds", "op": ">", "threshold": 0.5, "for": "5s"})
HOT = ThermalCondition.model_validate({"detector": "thermal", "margin_celsius": 5, "for": "5s"})
STALL = StallCondition.model_validate({"detector": "stall", "for": "5s"})


def policy(name: str, condition: dict[str, object], action: dict[str, object] | None = None) -> Policy:
    return Policy.model_validate({"name": name, "condition": condition,
                                  "action": action or {"kind": "alert", "severity": "warning"}})


TTFT_ALERT = policy("ttft-slo", {"signal": "ttft_p99_seconds", "op": ">", "threshold": 0.5, "for": "5s"})


def surging(start: float = 100.0) -> list[ReplicaSample]:
    """A report a second; TTFT p99 past 500 ms from the sample at ``start`` (two seconds after the one before)."""
    return healthy(start - 2, interval=1.0) + healthy(20, interval=1.0, start=start, ttft_p99_seconds=0.9)


def test_a_breach_under_way_is_due_for_seconds_after_its_first_crossing_sample() -> None:
    history = surging(100.0)
    snapshot = fleet(102.3, [replica(history=[s for s in history if s.at <= at(102.3)])])
    assert next_due([TTFT_ALERT], snapshot, at(102.3)) == at(105)


def test_a_round_at_the_due_moment_fires_before_the_report_of_that_second_arrives() -> None:
    # Reports up to 104 s are in; the one sent at 105 s is not. The round at 105 s acts on what it has.
    r = replica(history=[s for s in surging(100.0) if s.at <= at(104)])
    assert detect_threshold(TTFT, r, at(104.99)) is None
    assert detect_threshold(TTFT, r, at(105)) is not None
    [action] = evaluate([TTFT_ALERT], fleet(105, [r]), at(105))
    assert action.policy == "ttft-slo" and action.target.key == "replica:n1/r1"


def test_nothing_is_due_when_nothing_crosses_or_the_breach_is_met_already() -> None:
    calm = replica(history=healthy(120, interval=1.0))
    assert next_due([TTFT_ALERT], fleet(120, [calm]), at(120)) is None
    met = replica(history=surging(100.0))
    assert next_due([TTFT_ALERT], fleet(110, [met]), at(110)) is None  # the round finds it: nothing to wait for


def test_a_sample_back_under_the_threshold_starts_the_count_again() -> None:
    history = [s for s in surging(100.0) if s.at <= at(103)]
    history[-2:-1] = healthy(0, start=102)  # 102 s reads 200 ms
    assert next_due([TTFT_ALERT], fleet(103.5, [replica(history=history)]), at(103.5)) == at(108)


def test_out_of_scope_disabled_or_share_conditions_are_never_due() -> None:
    r = replica(history=[s for s in surging(100.0) if s.at <= at(102)])
    scoped = Policy.model_validate({**TTFT_ALERT.model_dump(by_alias=True), "scope": {"models": ["other-*"]}})
    off = Policy.model_validate({**TTFT_ALERT.model_dump(by_alias=True), "enabled": False})
    share = policy("share", {"signal": "ttft_p99_seconds", "op": ">", "threshold": 0.5, "for": "5s",
                             "min_share": 0.5})
    assert next_due([scoped, off, share], fleet(102, [r]), at(102)) is None
    assert next_due([scoped, TTFT_ALERT], fleet(102, [r]), at(102)) == at(105)


def test_a_hot_gpu_is_due_for_seconds_after_its_first_hot_reading() -> None:
    readings = gpu_readings(30, interval=1.0, temperature_celsius=lambda t: 87.0 if t >= 20 else 70.0)
    g = gpu(slowdown_temperature_celsius=89.0, history=[r for r in readings if r.at <= at(23)])
    thermal = policy("thermal", {"detector": "thermal", "margin_celsius": 5, "for": "5s"})
    assert next_due([thermal], fleet(23.5, [replica()], [g]), at(23.5)) == at(25)
    assert detect_thermal(HOT, g, at(24.99)) is None and detect_thermal(HOT, g, at(25)) is not None


def test_a_wedged_replica_is_due_for_seconds_after_the_counter_stopped() -> None:
    # Tokens move until the sample at 100 s read the counter at its last value; the verdict came at 103 s.
    history = healthy(100, interval=1.0) + healthy(
        4, interval=1.0, start=101, generation_tokens_total=1000.0 + 400.0 * 100, generation_tokens_per_second=0.0,
        canary_ok=False)
    r = replica(history=history, state=ReplicaState.WEDGED, state_since=at(103))
    stall = policy("stall", {"detector": "stall", "for": "5s"}, {"kind": "restart"})
    assert next_due([stall], fleet(104, [r]), at(104)) == at(105)
    assert detect_stall(STALL, r, at(104.99)) is None and detect_stall(STALL, r, at(105)) is not None


def test_the_rounds_wait_for_the_interval_or_the_due_moment_whichever_is_first() -> None:
    assert wait_seconds(None, at(100), 5.0) == 5.0
    assert wait_seconds(at(102), at(100), 5.0) == 2.0 + DUE_SLACK_SECONDS
    assert wait_seconds(at(200), at(100), 5.0) == 5.0
    assert wait_seconds(at(99), at(100), 5.0) == 0.0  # the round that saw it ran past it: at once
