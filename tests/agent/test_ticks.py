"""Shared ticks: timers of many tasks that round to the same multiple of their period fire in one loop pass."""

from __future__ import annotations

import pytest

from agent.ticks import until_tick


@pytest.mark.parametrize(("now", "every", "wait"), [
    (12.0, 5.0, 3.0),       # to the next multiple
    (15.0, 5.0, 5.0),       # on a tick: a whole period, never 0 (a loop would spin)
    (0.0, 5.0, 5.0),
    (14.999, 5.0, 0.001),
    (1.02, 0.05, 0.03),
    (7.0, 0.0, 0.0),        # no period: no wait
])
def test_the_wait_ends_on_the_next_tick(now: float, every: float, wait: float) -> None:
    assert until_tick(now, every) == pytest.approx(wait)


def test_tasks_started_apart_wake_on_the_same_tick() -> None:
    # Eight engines' log checks started 0.3 s apart, each waiting 5 s: one moment for all of them.
    ends = {round(start + until_tick(start, 5.0), 9) for start in (100.0 + 0.3 * i for i in range(8))}
    assert ends == {105.0}
