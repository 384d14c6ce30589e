"""Crash-loop policy: 10·2ⁿ s capped at 300 s; FATAL after N failures inside the window (no sleeping)."""

from __future__ import annotations

import pytest

from agent.backoff import FailureWindow, backoff_delay


def test_delays_double_from_ten_seconds_and_stop_at_five_minutes() -> None:
    assert [backoff_delay(n) for n in range(8)] == [10, 20, 40, 80, 160, 300, 300, 300]
    assert backoff_delay(10_000) == 300


def test_base_and_cap_are_configurable() -> None:
    assert [backoff_delay(n, base=0.1, cap=0.5) for n in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    with pytest.raises(ValueError):
        backoff_delay(-1)


def test_fatal_after_max_failures_within_the_window() -> None:
    window = FailureWindow(max_failures=3, window=60.0)
    assert window.record(now=0.0) == 10
    assert window.record(now=10.0) == 20
    assert window.record(now=30.0) is None  # third failure within 60 s


def test_failures_outside_the_window_are_forgotten() -> None:
    window = FailureWindow(max_failures=3, window=60.0)
    assert window.record(now=0.0) == 10
    assert window.record(now=50.0) == 20
    # The first failure is now 70 s old: only two recent ones, so back off again instead of FATAL.
    assert window.record(now=70.0) == 20
    assert window.recent == 2
    window.reset()
    assert window.record(now=71.0) == 10
