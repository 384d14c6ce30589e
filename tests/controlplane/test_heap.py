"""The server's heap freezer: full collections skip the history cache, and frozen cycles are freed hourly."""

from __future__ import annotations

import gc
import threading
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


def test_a_round_ends_with_one_full_collection_and_no_young_pass_over_what_it_built() -> None:
    """With the collector off, what a round built sits in the young generation with its count; the collection at
    the round's end runs before the collector is back on, so that count is spent and no young pass walks all of
    it again on the next allocation."""
    freezer = HeapFreezer()
    passes: list[int] = []
    me = threading.get_ident()

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and threading.get_ident() == me:  # this thread's passes, not another test's
            passes.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        with freezer.during_round():
            built = [[i] for i in range(20_000)]  # the round's snapshot: containers alive at its end
            assert not passes
        more = [[i] for i in range(1_000)]  # the next allocations, with the collector back on
        # Turned back on first, these would start a young pass over the 20,000 before any full collection.
        assert passes[:1] == [2], "the first pass after the round's start is the full collection at its end"
        assert len(built) + len(more) == 21_000
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()


def test_a_collector_turned_off_before_the_round_stays_off() -> None:
    gc.disable()
    try:
        with HeapFreezer().during_round():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_process_of_rounds_only_collects_on_its_schedule_and_keeps_the_collector_off() -> None:
    """The policy process's freezer: the first round's end collects and freezes (a whole window was read), a
    round within ``collect_seconds`` of the last collection leaves its cycles for the next one, and no automatic
    pass runs between rounds."""
    now = [0.0]
    freezer = HeapFreezer(monotonic=lambda: now[0], collect_seconds=30.0)
    passes: list[int] = []
    me = threading.get_ident()

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and threading.get_ident() == me:
            passes.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        with freezer.during_round():
            history = [[i] for i in range(20_000)]  # the whole window read by the first round
        assert passes == [2] and gc.get_freeze_count() >= len(history)
        assert not gc.isenabled()
        now[0] = 10.0
        with freezer.during_round():
            garbage = _Node()
            dead = weakref.ref(garbage)
            del garbage
        built = [[i] for i in range(20_000)]  # allocations between rounds: no young pass, the collector is off
        assert passes == [2] and dead() is not None and not gc.isenabled()
        now[0] = 30.0
        with freezer.during_round():
            pass
        assert passes == [2, 2] and dead() is None  # its time came: the cycle left ten seconds ago is freed
        assert len(built) == 20_000
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
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


class _PolicyProcess:
    """The part of ``PolicyProcess`` the jobs drive: the rounds run elsewhere."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def set_leader(self, _leader: bool) -> None: ...
    def poke(self) -> None: ...


def test_beside_a_policy_process_the_api_process_settles_its_heap(tmp_path: Path) -> None:
    """The API process runs no round, so nothing froze its heap and every automatic full pass walked it all,
    holding reports. With a policy process and a freezer, the jobs collect and freeze it from the start."""
    from controlplane.config import ServerConfig
    from controlplane.heap import SETTLE_SECONDS
    from controlplane.jobs import Jobs
    from controlplane.leader import SingleProcessLeadership
    from controlplane.store.db import make_engine, make_sessionmaker, migrate
    from tests.helpers import wait_until

    url = f"sqlite:///{tmp_path / 'cp.db'}"
    engine = make_engine(url)
    migrate(engine)
    gc.unfreeze()
    garbage = _Node()
    dead = weakref.ref(garbage)
    del garbage
    jobs = Jobs(sessions=make_sessionmaker(engine), leadership=SingleProcessLeadership(),
                config=ServerConfig(database_url=url), clock=lambda: datetime.now(UTC), heap=HeapFreezer(),
                policy_process=_PolicyProcess())  # type: ignore[arg-type]
    try:
        jobs.start()
        job = jobs._scheduler.get_job("settle_heap")
        assert job is not None and job.trigger.interval.total_seconds() == SETTLE_SECONDS
        wait_until(lambda: gc.get_freeze_count() > 0, timeout=30, what="the first settle, due at start")
        assert dead() is None, "the garbage made before it was collected, not frozen"
    finally:
        jobs.stop()
        gc.unfreeze()
        engine.dispose()


def test_without_a_freezer_or_with_rounds_here_there_is_no_settle_job(tmp_path: Path) -> None:
    from controlplane.config import ServerConfig
    from controlplane.jobs import Jobs
    from controlplane.leader import SingleProcessLeadership
    from controlplane.store.db import make_engine, make_sessionmaker, migrate

    url = f"sqlite:///{tmp_path / 'cp.db'}"
    engine = make_engine(url)
    migrate(engine)
    for heap, process in ((None, _PolicyProcess()), (HeapFreezer(), None)):
        jobs = Jobs(sessions=make_sessionmaker(engine), leadership=SingleProcessLeadership(),
                    config=ServerConfig(database_url=url, policy_interval_seconds=3600),
                    clock=lambda: datetime.now(UTC), heap=heap, policy_process=process)  # type: ignore[arg-type]
        try:
            jobs.start()
            assert jobs._scheduler.get_job("settle_heap") is None  # the rounds' own freezer does it, or no one
        finally:
            jobs.stop()
            gc.unfreeze()
    engine.dispose()
