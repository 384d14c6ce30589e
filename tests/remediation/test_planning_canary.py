"""Pure parts of the loop: when a planned restart runs, and how a canary is judged against its peers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.policy.canary import judge_canary
from controlplane.policy.signals import ReplicaSample
from controlplane.remediation.planning import plan_restart, restart_deadline
from tests.controlplane.fixtures import T0


def test_a_planned_restart_waits_for_the_quietest_hour_seen_a_day_ago() -> None:
    # Yesterday: busy (10 req/s) except a lull from +40 to +50 minutes.
    history = [(T0 - timedelta(days=1) + timedelta(minutes=m), 1.0 if 40 <= m <= 50 else 10.0)
               for m in range(0, 120, 1)]
    not_before, why = plan_restart(T0, T0 + timedelta(hours=1), history)
    assert T0 + timedelta(minutes=35) <= not_before <= T0 + timedelta(minutes=55)
    assert "quietest" in why


def test_a_planned_restart_runs_at_once_without_time_or_history() -> None:
    assert plan_restart(T0, T0 + timedelta(minutes=5), [])[0] == T0
    when, why = plan_restart(T0, T0 + timedelta(hours=1), [])
    assert when == T0 and "no request-rate history" in why


def _lull_at(now: datetime, minutes: range) -> list[tuple[datetime, float]]:
    """Yesterday's rate each minute from 2 h before ``now`` to 3 h after: 10 req/s, 1 req/s in ``minutes``."""
    base = now - timedelta(days=1)
    return [(base + timedelta(minutes=m), 1.0 if m in minutes else 10.0) for m in range(-120, 180)]


@pytest.mark.parametrize("now", [
    datetime(2026, 11, 30, 8, 0, tzinfo=UTC),     # an hour's first minute
    datetime(2026, 11, 30, 8, 59, tzinfo=UTC),    # its last: the lull is in the next clock hour
    datetime(2026, 11, 30, 23, 50, tzinfo=UTC),   # the lull is after midnight, its history before it
    datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC),
    datetime(2026, 12, 31, 23, 45, tzinfo=UTC),   # a month's and a year's end
    datetime(2027, 3, 1, 0, 0, tzinfo=UTC),       # yesterday is the last day of February
], ids=lambda t: t.strftime("%Y%m%d_%H%M%S"))
def test_the_quiet_slot_is_found_whatever_the_clock_or_the_date(now: datetime) -> None:
    not_before, why = plan_restart(now, now + timedelta(hours=1), _lull_at(now, range(30, 36)))
    assert now + timedelta(minutes=25) <= not_before <= now + timedelta(minutes=41), why
    assert "quietest" in why


def test_a_lull_right_now_runs_the_restart_now() -> None:
    now = datetime(2026, 11, 30, 23, 59, tzinfo=UTC)
    assert plan_restart(now, now + timedelta(hours=1), _lull_at(now, range(-3, 4)))[0] == now


def test_a_lull_past_the_deadline_is_not_waited_for() -> None:
    now = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
    not_before, _ = plan_restart(now, now + timedelta(minutes=30), _lull_at(now, range(50, 60)))
    assert not_before <= now + timedelta(minutes=30)


def test_the_deadline_comes_before_projected_exhaustion() -> None:
    assert restart_deadline(T0, 3600, seconds_to_limit=600) == T0 + timedelta(seconds=480)
    assert restart_deadline(T0, 3600, seconds_to_limit=None) == T0 + timedelta(hours=1)


def _samples(ttft: float, itl: float, tps: float, n: int = 5) -> list[ReplicaSample]:
    return [ReplicaSample(at=T0, ttft_p99_seconds=ttft, itl_p99_seconds=itl, generation_tokens_per_second=tps)] * n


def test_a_canary_no_worse_than_its_peers_passes() -> None:
    verdict = judge_canary(_samples(0.3, 0.02, 95), [_samples(0.8, 0.03, 100)] * 2, 0.1, 0.25)
    assert verdict.verdict == "pass"
    assert verdict.figures["peers_ttft_p99_seconds"] == pytest.approx(0.8)


def test_a_canary_with_worse_latency_or_much_less_throughput_fails() -> None:
    slower = judge_canary(_samples(1.2, 0.02, 100), [_samples(0.8, 0.02, 100)], 0.1, 0.25)
    assert slower.verdict == "fail" and "ttft_p99_seconds" in slower.reason
    starved = judge_canary(_samples(0.5, 0.02, 50), [_samples(0.8, 0.02, 100)], 0.1, 0.25)
    assert starved.verdict == "fail" and "generation_tokens_per_second" in starved.reason


def test_a_canary_without_samples_waits() -> None:
    assert judge_canary([], [_samples(0.8, 0.02, 100)], 0.1, 0.25).verdict == "wait"


def test_a_change_made_to_cut_latency_must_cut_it_by_the_gain_asked_for() -> None:
    baseline = [_samples(0.8, 0.30, 100)]
    cut = judge_canary(_samples(0.8, 0.15, 98), baseline, 0.1, 0.25, ["itl_p99_seconds"], min_latency_gain=0.05)
    assert cut.verdict == "pass" and "cut itl p99 by at least 5%" in cut.reason
    flat = judge_canary(_samples(0.8, 0.29, 100), baseline, 0.1, 0.25, ["itl_p99_seconds"], min_latency_gain=0.05)
    assert flat.verdict == "fail" and "must cut it by 5%" in flat.reason and "-3%" in flat.reason
    # Cutting latency by starving throughput is still a failure.
    starved = judge_canary(_samples(0.8, 0.15, 60), baseline, 0.1, 0.25, ["itl_p99_seconds"], min_latency_gain=0.05)
    assert starved.verdict == "fail" and "generation_tokens_per_second" in starved.reason
    # No baseline reading: a gain cannot be shown, so the change is not kept.
    empty = judge_canary(_samples(0.8, 0.15, 100), [[]], 0.1, 0.25, ["itl_p99_seconds"], min_latency_gain=0.05)
    assert empty.verdict == "fail" and "a gain cannot be shown" in empty.reason


def test_one_burst_in_the_window_does_not_fail_a_canary_that_was_better_in_nearly_every_reading() -> None:
    # Per-scrape ITL p99 readings: the canary (a smaller batch) sits near 40 ms with one reconnect wave
    # lifting three readings to 170-300 ms (its mean 14 % over the peer's); its peer at a larger batch reads
    # 50-140 ms with its own bursts.
    canary = [ReplicaSample(at=T0, itl_p99_seconds=v, generation_tokens_per_second=2100.0)
              for v in (0.037, 0.025, 0.037, 0.09, 0.300, 0.290, 0.174, 0.044, 0.037, 0.044, 0.038, 0.037)]
    peer = [ReplicaSample(at=T0, itl_p99_seconds=v, generation_tokens_per_second=2800.0)
            for v in (0.092, 0.065, 0.048, 0.132, 0.142, 0.133, 0.092, 0.091, 0.049, 0.048, 0.047, 0.075)]
    verdict = judge_canary(canary, [peer], 0.1, 0.35, ["itl_p99_seconds"])
    assert verdict.verdict == "pass", verdict.reason
    assert verdict.figures["canary_itl_p99_seconds"] == pytest.approx(0.041)
    assert verdict.figures["peers_itl_p99_seconds"] == pytest.approx(0.083)
    # Worse in most readings is worse, whatever the odd good one.
    slow = [replace(c, itl_p99_seconds=0.12) for c in canary[:9]] + canary[9:]
    assert judge_canary(slow, [peer], 0.1, 0.35, ["itl_p99_seconds"]).verdict == "fail"
