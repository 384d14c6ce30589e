"""The benchmark's reading of when a condition was met: the first crossing sample of the run, plus ``for:``."""

from __future__ import annotations

from datetime import timedelta

from bench.harness.crossing import stall_due, threshold_due
from controlplane.policy.conditions import ThresholdCondition
from tests.policy.series import at, healthy

TTFT = ThresholdCondition.model_validate({"signal": "ttft_p99_seconds", "op": ">", "threshold": 0.5, "for": "5s"})


def test_the_run_that_led_to_the_action_counts_not_an_earlier_blip() -> None:
    history = (healthy(10, interval=1.0, ttft_p99_seconds=lambda t: 0.9 if t == 3 else 0.2)
               + healthy(10, interval=1.0, start=11, ttft_p99_seconds=0.9))
    due = threshold_due(TTFT, history, at(16.2))
    assert due is not None and due.crossed_at == at(11) and due.due_at == at(16)
    assert threshold_due(TTFT, history[:10], at(9)) is None  # not crossing at the action: nothing to measure



def test_a_share_condition_is_due_when_its_window_first_held_enough_crossings() -> None:
    share = TTFT.model_copy(update={"min_share": 0.5})
    history = (healthy(10, interval=1.0, ttft_p99_seconds=0.2)
               + healthy(10, interval=1.0, start=11, ttft_p99_seconds=lambda t: 0.2 if t % 3 == 1 else 0.9))
    # 11 and 12 cross, 13 does not, 14 does: at 14 the window from 9 holds three crossings in six readings.
    due = threshold_due(share, history, at(16.3))
    assert due is not None and due.crossed_at == at(11) and due.due_at == at(14)
    assert threshold_due(share, history[:12], at(11.5)) is None  # one crossing in six: not met at the action

def test_a_stall_is_due_at_the_later_of_the_flat_counter_and_the_verdict() -> None:
    history = healthy(10, interval=1.0) + healthy(10, interval=1.0, start=11, generation_tokens_total=9999.0)
    early = stall_due(5.0, history, at(20), wedged_at=at(14))
    assert early is not None and early.crossed_at == at(11) and early.due_at == at(16) and early.by == "for"
    late = stall_due(5.0, history, at(20), wedged_at=at(18))
    assert late is not None and late.due_at == at(18) and late.by == "verdict"
    assert stall_due(5.0, history, at(20), wedged_at=None) is None
    assert early.due_at - early.crossed_at == timedelta(seconds=5)
