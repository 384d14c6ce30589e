"""The server's heap freezer: full collections skip the history cache, and frozen cycles are freed hourly."""

from __future__ import annotations

import gc
import weakref
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controlplane.heap import HeapFreezer
from controlplane.remediation.history import SampleHistory


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector can free it


def test_frozen_cycles_are_reclaimed_at_the_hourly_thaw() -> None:
    now = [0.0]
    freezer = HeapFreezer(thaw_seconds=3600, monotonic=lambda: now[0])
    try:
        garbage = _Node()
        dead = weakref.ref(garbage)
        del garbage
        freezer.after_round()  # garbage made since the last round is collected before freezing
        assert dead() is None

        alive = _Node()
        held = weakref.ref(alive)
        freezer.after_round()
        assert gc.get_freeze_count() > 0
        del alive
        gc.collect()
        assert held() is not None  # frozen while alive: the collector does not see it die
        now[0] = 3600.0
        freezer.after_round()
        assert held() is None  # the hourly thaw frees it
    finally:
        gc.unfreeze()


def test_a_round_runs_without_automatic_collection_and_its_cycles_are_freed_after() -> None:
    freezer = HeapFreezer()
    assert gc.isenabled()
    try:
        with freezer.during_round():
            assert not gc.isenabled()  # no full pass walks what the round is building
            garbage = _Node()
            dead = weakref.ref(garbage)
            del garbage
        assert gc.isenabled()
        freezer.after_round()
        assert dead() is None  # the round's cycles go with the collection after it
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_collector_turned_off_before_the_round_stays_off() -> None:
    gc.disable()
    try:
        with HeapFreezer().during_round():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_server_rounds_and_follows_run_with_the_collector_off(tmp_path: Path) -> None:
    """``PolicyRounds`` with the server's freezer: the round (its policy hook sees it) and a standby's follow
    run without automatic passes, and the collector is back on between them."""
    from controlplane.config import ServerConfig
    from controlplane.rounds import PolicyRounds
    from controlplane.store.db import make_engine, make_sessionmaker, migrate

    url = f"sqlite:///{tmp_path / 'cp.db'}"
    engine = make_engine(url)
    migrate(engine)
    seen: list[bool] = []
    freezer = HeapFreezer()
    refresh = SampleHistory.refresh

    def watched_refresh(self: SampleHistory, *args: Any, **kwargs: Any) -> int:
        seen.append(gc.isenabled())
        return refresh(self, *args, **kwargs)

    rounds = PolicyRounds(sessions=make_sessionmaker(engine), config=ServerConfig(database_url=url),
                          clock=lambda: datetime(2026, 12, 1, tzinfo=UTC), heap=freezer,
                          policy_hook=lambda _session, _now: seen.append(gc.isenabled()))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(SampleHistory, "refresh", watched_refresh)
            assert rounds.run() is not None
            assert gc.isenabled()
            assert rounds.follow() is not None
        assert gc.isenabled()
        assert seen == [False, False, False]  # the round's history read, its policy hook, the follow's read
    finally:
        gc.unfreeze()
        gc.enable()
        engine.dispose()
