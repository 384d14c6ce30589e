"""A slow policy round (a large fleet) makes the next one wait, so reports are never starved by evaluation."""

from __future__ import annotations

from pathlib import Path

from controlplane.rounds import SLOW_ROUND_SECONDS, round_pause


def test_a_quick_round_never_delays_the_next() -> None:
    assert round_pause(100.0, 100.0 + SLOW_ROUND_SECONDS / 2, 0.25) == 100.0 + SLOW_ROUND_SECONDS / 2


def test_a_slow_round_keeps_rounds_to_their_share_of_the_time() -> None:
    # 4 s of work at a 25 % duty: 12 s of pause, so 4 s in every 16 s.
    assert round_pause(100.0, 104.0, 0.25) == 116.0
    assert round_pause(100.0, 104.0, 1.0) == 104.0


def test_the_first_round_that_judges_everything_does_not_count_against_the_next(tmp_path: Path) -> None:
    """A new leader's first round judges every subject (the rounds after it judge what changed): like reading
    the window, it is a once-per-term cost, and the second round may follow at once; the third waits."""
    from datetime import UTC, datetime

    from controlplane.config import ServerConfig
    from controlplane.rounds import PolicyRounds
    from controlplane.store.db import make_engine, make_sessionmaker, migrate

    url = f"sqlite:///{tmp_path / 'cp.db'}"
    engine = make_engine(url)
    migrate(engine)
    # Monotonic readings in call order: each run reads it when asking whether it is due, at its start and end.
    ticks = iter([0.0, 0.0, 3.0, 3.0, 3.0, 5.0, 7.0, 20.0, 20.0, 20.5])
    config = ServerConfig(database_url=url, policy_max_duty=0.25)
    rounds = PolicyRounds(sessions=make_sessionmaker(engine), config=config,
                          clock=lambda: datetime(2026, 12, 1, tzinfo=UTC), monotonic=lambda: next(ticks))
    try:
        assert rounds.run() is not None  # 0 -> 3 s: the evaluator's first, whole judgement
        assert rounds.evaluator.primed
        assert rounds.run() is not None  # due at once: 3 -> 5 s, a slow round of the steady kind
        assert rounds.run() is None  # 2 s at a 25 % duty: the next waits until 11 s
        assert rounds.run() is not None  # at 20 s
    finally:
        engine.dispose()
