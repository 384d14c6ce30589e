"""The policy process's pace: a burst of reports makes one round, and at fleet scale no round waits for nothing."""

from __future__ import annotations

import threading

from controlplane.policy_process import debounce_after, next_round


class _Stop(threading.Event):
    """The stop event, never set: it records how long the loop waited on it (the debounce), without waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(0)


def test_a_report_after_a_quiet_spell_waits_the_debounce_for_the_rest_of_its_burst() -> None:
    poke, stop = threading.Event(), _Stop()
    poke.set()
    next_round(poke, stop, wait=5.0, debounce=debounce_after(0.25, took=0.01, poked=False))
    assert stop.waits == [0.25]
    assert not poke.is_set()  # the burst is the next round's


def test_reports_during_a_long_round_start_the_next_round_at_once() -> None:
    """At 1,000 nodes rounds run back to back and reports arrive all through each: those have waited a round's
    length already, so the next round starts without the quarter second."""
    poke, stop = threading.Event(), _Stop()
    poke.set()  # a report arrived while the last round ran
    next_round(poke, stop, wait=5.0, debounce=debounce_after(0.25, took=4.0, poked=True))
    assert stop.waits == []
    assert not poke.is_set()


def test_a_quick_round_still_debounces_the_reports_that_came_during_it() -> None:
    # A small fleet's round takes milliseconds: a report during it may be the first of a burst.
    assert debounce_after(0.25, took=0.01, poked=True) == 0.25
    assert debounce_after(0.25, took=4.0, poked=False) == 0.25


def test_with_no_report_the_round_waits_for_its_moment() -> None:
    poke, stop = _Stop(), _Stop()
    next_round(poke, stop, wait=1.5, debounce=0.25)
    assert poke.waits == [1.5]  # the interval, or the next condition's moment (``due.wait_seconds``)
    assert stop.waits == []
