"""A slow policy round (a large fleet) makes the next one wait, so reports are never starved by evaluation."""

from __future__ import annotations

from controlplane.config import ServerConfig
from controlplane.jobs import SLOW_ROUND_SECONDS, Jobs


def _jobs(duty: float) -> Jobs:
    jobs = Jobs.__new__(Jobs)  # only the pause rule is under test: no scheduler, no database
    jobs._config = ServerConfig(policy_max_duty=duty)
    return jobs


def test_a_quick_round_never_delays_the_next() -> None:
    assert _jobs(0.25)._round_pause(100.0, 100.0 + SLOW_ROUND_SECONDS / 2) == 100.0 + SLOW_ROUND_SECONDS / 2


def test_a_slow_round_keeps_rounds_to_their_share_of_the_time() -> None:
    # 4 s of work at a 25 % duty: 12 s of pause, so 4 s in every 16 s.
    assert _jobs(0.25)._round_pause(100.0, 104.0) == 116.0
    assert _jobs(1.0)._round_pause(100.0, 104.0) == 104.0
