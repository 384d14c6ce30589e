"""The server's heap freezer: full collections skip the history cache, and frozen cycles are freed hourly."""

from __future__ import annotations

import gc
import weakref

from controlplane.heap import HeapFreezer


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
