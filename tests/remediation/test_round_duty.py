"""A slow policy round (a large fleet) makes the next one wait, so reports are never starved by evaluation."""

from __future__ import annotations

from controlplane.rounds import SLOW_ROUND_SECONDS, round_pause


def test_a_quick_round_never_delays_the_next() -> None:
    assert round_pause(100.0, 100.0 + SLOW_ROUND_SECONDS / 2, 0.25) == 100.0 + SLOW_ROUND_SECONDS / 2


def test_a_slow_round_keeps_rounds_to_their_share_of_the_time() -> None:
    # 4 s of work at a 25 % duty: 12 s of pause, so 4 s in every 16 s.
    assert round_pause(100.0, 104.0, 0.25) == 116.0
    assert round_pause(100.0, 104.0, 1.0) == 104.0
