from agent.wire import ReplicaState
from controlplane.policy.conditions import StallCondition
from controlplane.policy.detectors.stall import detect_stall
from tests.policy.series import at, healthy, replica

STALL = StallCondition.model_validate({"detector": "stall", "for": "2m"})


def wedged(start: float, duration: float, canary_ok: bool | None = False):
    """Requests queued, the token counter frozen, the canary timing out."""
    return healthy(duration, start=start, requests_running=8.0, requests_waiting=5.0,
                   generation_tokens_total=123456.0, generation_tokens_per_second=0.0, canary_ok=canary_ok,
                   canary_ttft_seconds=None)


def test_wedged_engine_with_failed_canary_is_a_stall():
    history = healthy(300) + wedged(310, 180)
    finding = detect_stall(STALL, replica(history=history), at(490))
    assert finding is not None
    assert "canary failed" in finding.summary
    assert finding.evidence[-1].values["generation_tokens_total"] == 123456.0


def test_slow_canary_under_a_full_batch_is_busy_not_wedged():
    # 256 running at --max-num-seqs 256, queue growing, canary too slow — but tokens keep moving (ray#54070).
    history = healthy(600, requests_running=256.0, requests_waiting=40.0, canary_ok=False, canary_ttft_seconds=9.0)
    assert detect_stall(STALL, replica(history=history), at(600)) is None


def test_frozen_counter_without_work_is_idle_not_stalled():
    history = healthy(600, requests_running=0.0, requests_waiting=0.0, generation_tokens_total=5000.0,
                      generation_tokens_per_second=0.0, canary_ok=True)
    assert detect_stall(STALL, replica(history=history), at(600)) is None


def test_no_progress_but_canary_passing_needs_confirmation():
    history = healthy(300) + wedged(310, 180, canary_ok=True)
    assert detect_stall(STALL, replica(history=history), at(490)) is None
    relaxed = STALL.model_copy(update={"require_canary_failure": False})
    assert detect_stall(relaxed, replica(history=history), at(490)) is not None


def test_stall_shorter_than_the_window_does_not_fire():
    history = healthy(300) + wedged(310, 60)
    assert detect_stall(STALL, replica(history=history), at(370)) is None


def test_a_replica_still_warming_is_not_judged():
    history = healthy(300) + wedged(310, 180)
    assert detect_stall(STALL, replica(history=history, state=ReplicaState.WARMING), at(490)) is None
