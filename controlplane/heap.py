"""``HeapFreezer``: keep the garbage collector's full passes off the report path of a large fleet's leader.

The leader's sample history holds millions of small objects (a 1,000-node fleet: about two million). They
never form reference cycles, but CPython's collector still walks every one in each full pass, which then
holds the interpreter for a second or more while reports wait. After each policy round the freezer
collects what is new (cheap: frozen objects are not walked) and freezes the survivors, so full passes only
ever see the objects made since the last round.

Freezing has one cost: an object frozen while alive that later dies inside a reference cycle is not
reclaimed while frozen. The freezer therefore thaws the heap and runs one full collection every
``thaw_seconds`` (an hour by default), which bounds that to one hour's worth.

A round also runs with the automatic collector off (``during_round``). A round builds the fleet's snapshot and
its judgements, some hundred thousand objects. With the old heap frozen, CPython's rule for a full pass (new
survivors over a quarter of the unfrozen heap) holds after every ten young passes: at 1,000 nodes that was four
full passes a round, each walking everything the round had built so far, about a quarter of the round's time. The
round's garbage is freed by reference counting as it goes; what cycles it leaves are reclaimed by the collection
at its end, run before the collector is turned back on.

That process (``policy_process``) does nothing but rounds, so its collector stays off between them too, and the
collection and freeze run once ``ROUNDS_ONLY_COLLECT_SECONDS`` has passed since the last, not after every round.
A round's survivors sit young until then, and what died among them (most of a round's snapshot is replaced by the
next) is gone by reference counting; a collection walks what is still alive of them once, not each round's
hundreds of thousands of new objects after every round: at 1,000 nodes that walk was 0.13-0.2 s of a 1-s round, and
what it found was some fifty objects of query-building cycles (about 24 KB). Those now wait at most that long.

Where the rounds run in a process of their own (``policy_process``), the API process has no rounds, but its heap
still holds some 150,000 long-lived objects (modules, schemas, caches), and each automatic full pass walked them
all: about 0.1 s under a 1,000-node fleet's load, holding every report in flight, which set the report p99
(26 passes over 20 ms, at most 128 ms, in one three-minute PostgreSQL load run). That process settles its heap
the same way every ``SETTLE_SECONDS`` (``controlplane.jobs``), so its full passes walk only what the last half
minute left alive.

Only the server's processes use it (``pitstop server``): it changes process-wide state.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# How often a process without rounds (the API process beside a policy process) collects and freezes its heap.
SETTLE_SECONDS = 30.0
# How often a process of nothing but rounds (the policy process) collects and freezes: its ``collect_seconds``.
ROUNDS_ONLY_COLLECT_SECONDS = 30.0


class HeapFreezer:
    """``collect_seconds``: 0 to collect and freeze after every round, the collector back on between rounds (a
    process that serves anything else); above 0, for a process that does nothing but rounds, the collector stays
    off and a round's end collects and freezes only once that long has passed since the last time."""

    def __init__(self, thaw_seconds: float = 3600.0, monotonic: Callable[[], float] = time.monotonic,
                 collect_seconds: float = 0.0) -> None:
        self._thaw_seconds = thaw_seconds
        self._monotonic = monotonic
        self._thawed_at = monotonic()
        self._collect_seconds = collect_seconds
        self._collected_at: float | None = None  # the first round's end collects (a whole window read: freeze it)

    @contextmanager
    def during_round(self) -> Iterator[None]:
        """No automatic collection while a round runs; at its end, still without, ``after_round`` collects what
        it left and freezes the rest. Then the collector's earlier setting comes back, so one turned off by
        someone else stays off.

        In that order because, with the collector off, every container the round made stays in the young
        generation with its count: turned back on first, the next allocation would run a young pass over all
        of them (0.17-0.24 s a round at 1,000 nodes, measured), just before ``after_round`` walked them again.
        With ``collect_seconds``, the collection waits for its time and the collector stays off (class docstring)."""
        was = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            rounds_only = self._collect_seconds > 0
            try:
                last = self._collected_at
                if not rounds_only or last is None or self._monotonic() - last >= self._collect_seconds:
                    self.after_round()
            finally:
                if was and not rounds_only:
                    gc.enable()

    def after_round(self) -> None:
        """Collect the garbage made since the last round (or the last settle), then freeze what is left alive."""
        now = self._monotonic()
        self._collected_at = now
        if now - self._thawed_at >= self._thaw_seconds:
            gc.unfreeze()  # the hourly full pass: reclaim cycles among objects frozen while alive
            self._thawed_at = now
        gc.collect()
        gc.freeze()
