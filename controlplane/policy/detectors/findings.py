"""What a detector returns: a finding, its measured figures and the samples that triggered it."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from operator import attrgetter, sub
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

# Evidence kept per finding: enough to see the shape of a series, small enough for a page.
EVIDENCE_POINTS = 12
# A history whose newest sample is older than this is a node that stopped reporting, not a signal.
STALE_AFTER_SECONDS = 180.0
_STALE = timedelta(seconds=STALE_AFTER_SECONDS)

Value = float | int | bool | str | list[str] | list[int] | None
Measured = float | int | bool | str | None


class Evidence(BaseModel):
    model_config = ConfigDict(frozen=True)

    at: datetime
    values: dict[str, Value]


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    detector: str
    subject: str  # the replica ("node/replica") or GPU ("node/index") it is about
    summary: str
    measured: dict[str, Measured] = Field(default_factory=dict)
    evidence: list[Evidence] = Field(default_factory=list)

    def figure(self, key: str, default: float = 0.0) -> float:
        """A measured figure as a float (``default`` when absent or not a number)."""
        value = self.measured.get(key)
        return float(value) if isinstance(value, int | float) else default


class Timed(Protocol):
    @property
    def at(self) -> datetime: ...


S = TypeVar("S")
T = TypeVar("T", bound=Timed)


def thin(items: Sequence[S], limit: int = EVIDENCE_POINTS) -> list[S]:
    """At most ``limit`` items, evenly spread, always keeping the first and the last."""
    if len(items) <= limit:
        return list(items)
    step = (len(items) - 1) / (limit - 1)
    return [items[round(i * step)] for i in range(limit)]


def evidence_of(items: Iterable[Timed], fields: Sequence[str]) -> list[Evidence]:
    """Evidence points carrying only ``fields`` of each sample (thinned before they are built: a finding over a
    long run keeps a dozen of its samples, and builds no more)."""
    return [Evidence(at=item.at, values={f: getattr(item, f) for f in fields}) for item in thin(list(items))]


# A sample's time, as a binary search's key (a C getter: the searches run for every replica, every round).
_at: Callable[[Timed], datetime] = attrgetter("at")


def upto(samples: Sequence[T], now: datetime) -> int:
    """How many of the time-ordered ``samples`` are at or before ``now`` (a binary search, not a scan; none when
    the newest is, a round's usual case)."""
    if samples and samples[-1].at <= now:
        return len(samples)
    return bisect_right(samples, now, key=_at)


def since(samples: Sequence[T], start: datetime, now: datetime) -> Sequence[T]:
    """The time-ordered ``samples`` with ``start <= at <= now``, found by binary search."""
    first, end = between(samples, start, now)
    return samples[first:end]


def between(samples: Sequence[T], start: datetime, now: datetime) -> tuple[int, int]:
    """Where ``since`` begins and ends in ``samples``: the slice's bounds."""
    return first_from(samples, start), upto(samples, now)


def first_from(samples: Sequence[T], start: datetime) -> int:
    """Where the time-ordered ``samples`` at or after ``start`` begin (a binary search; none is needed when the
    oldest is, as with a window longer than the history)."""
    if not samples or samples[0].at >= start:
        return 0
    return bisect_left(samples, start, key=_at)


def held_for(samples: Sequence[T], now: datetime, seconds: float, holds: Callable[[T], bool]) -> list[T] | None:
    """The samples covering the last ``seconds`` if ``holds`` is true of every one of them, else None.

    Coverage needs an anchor: a sample at or before ``now - seconds``; without one the history is too short
    to say the condition held for the whole duration. A stale history (no recent sample) or one with a
    reporting gap inside the window never holds.

    ``samples`` are time-ordered. The newest sample is judged first, so a healthy replica costs one check however
    long its history (a 1,000-node fleet has 8,000); the window is found by binary search.
    """
    start = now - timedelta(seconds=seconds)
    end = upto(samples, now)
    if end == 0 or now - samples[end - 1].at > _STALE or not holds(samples[end - 1]):
        return None
    first = _anchor(samples, start, end)
    if first is None:
        return None
    run = list(samples[first:end])
    return run if all(map(holds, run)) else None


def covering_span(samples: Sequence[T], now: datetime, seconds: float) -> tuple[int, int] | None:
    """Where ``covering``'s samples begin and end in ``samples`` (a slice's bounds), or None."""
    start = now - timedelta(seconds=seconds)
    end = upto(samples, now)
    if end == 0 or now - samples[end - 1].at > _STALE:
        return None
    first = _anchor(samples, start, end)
    return None if first is None else (first, end)


def _anchor(samples: Sequence[T], start: datetime, end: int) -> int | None:
    """Where the run covering ``start`` up to the ``end``-th sample begins: the last sample at or before
    ``start`` (the newest one when it is that old already); None without one, or with a reporting gap
    between it and the newest (nobody saw what happened in a gap)."""
    first = bisect_right(samples, start, 0, end, key=_at) - 1
    if first < 0:
        return None  # no anchor: the history is shorter than the duration
    return first if _unbroken(samples, first, end) else None


def _unbroken(samples: Sequence[T], first: int, end: int) -> bool:
    """No reporting gap between consecutive samples of ``samples[first:end]`` (time-ordered).

    A stretch spanning no more than a gap has none inside it: the run is read a block at a time, and only a
    block spanning more is read sample by sample (a quarter of an hour every 5 s is ten blocks, not 180 pairs).
    """
    last = end - 1
    if last - first < 1:
        return True
    span = samples[last].at - samples[first].at
    if span <= _STALE:
        return True
    stride = max(1, int((last - first) * (_STALE / span) / 2))
    marks = [*range(first, last, stride), last]
    for a, b in pairwise(marks):
        if samples[b].at - samples[a].at > _STALE:
            ats = [s.at for s in samples[a:b + 1]]
            if any(map(_STALE.__lt__, map(sub, ats[1:], ats))):
                return False
    return True


def due_at(samples: Sequence[T], now: datetime, seconds: float, holds: Callable[[T], bool]) -> datetime | None:
    """When ``held_for`` first holds if every sample from now on holds too: the first sample of the unbroken run
    that holds through the newest one, plus ``seconds``. None when the newest sample does not hold, or the
    condition has held long enough already (``held_for`` finds it now).

    ``for:`` counts from that first sample's time, not from the round that first read it: a round at the
    returned moment fires, whenever the reports came in. The walk stops at ``seconds``, as ``held_for``'s does.
    """
    start = now - timedelta(seconds=seconds)
    end = len(samples) if samples and samples[-1].at <= now else upto(samples, now)  # a round's usual case, cheap
    if end == 0 or now - samples[end - 1].at > _STALE:
        return None
    i = end - 1
    if not holds(samples[i]):
        return None
    while samples[i].at > start:
        if i == 0 or samples[i].at - samples[i - 1].at > _STALE or not holds(samples[i - 1]):
            return samples[i].at + timedelta(seconds=seconds)  # the run starts here; its anchor, later
        i -= 1
    return None


def covering(samples: Sequence[T], now: datetime, seconds: float) -> list[T] | None:
    """The samples covering the last ``seconds`` (with their anchor), or None when history is too short (or
    stale, or broken by a reporting gap): ``held_for`` of a condition that always holds."""
    span = covering_span(samples, now, seconds)
    return None if span is None else list(samples[span[0]:span[1]])
