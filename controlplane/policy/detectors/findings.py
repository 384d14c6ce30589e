"""What a detector returns: a finding, its measured figures and the samples that triggered it."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
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
    """Evidence points carrying only ``fields`` of each sample (thinned)."""
    points = [Evidence(at=item.at, values={f: getattr(item, f) for f in fields}) for item in items]
    return thin(points)


def upto(samples: Sequence[T], now: datetime) -> int:
    """How many of the time-ordered ``samples`` are at or before ``now`` (a binary search, not a scan)."""
    return bisect_right(samples, now, key=_at)


def since(samples: Sequence[T], start: datetime, now: datetime) -> Sequence[T]:
    """The time-ordered ``samples`` with ``start <= at <= now``, found by binary search."""
    return samples[bisect_left(samples, start, key=_at):upto(samples, now)]


def _at(sample: Timed) -> datetime:
    return sample.at


def held_for(samples: Sequence[T], now: datetime, seconds: float, holds: Callable[[T], bool]) -> list[T] | None:
    """The samples covering the last ``seconds`` if ``holds`` is true of every one of them, else None.

    Coverage needs an anchor: a sample at or before ``now - seconds``; without one the history is too short
    to say the condition held for the whole duration. A stale history (no recent sample) or one with a
    reporting gap inside the window never holds.

    ``samples`` are time-ordered. The walk goes backwards from the newest sample and stops at the first that
    fails, so a healthy replica costs one check however long its history (a 1,000-node fleet has 8,000).
    """
    start = now - timedelta(seconds=seconds)
    end = upto(samples, now)
    if end == 0 or now - samples[end - 1].at > _STALE:
        return None
    i = end - 1
    later = samples[i]
    if not holds(later):
        return None
    while later.at > start:
        if i == 0:
            return None  # no anchor: the history is shorter than the duration
        before = samples[i - 1]
        if later.at - before.at > _STALE or not holds(before):
            return None  # a reporting gap (nobody saw what happened in it), or the condition broke
        i -= 1
        later = before
    return list(samples[i:end])


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
    """The samples covering the last ``seconds`` (with their anchor), or None when history is too short."""
    return held_for(samples, now, seconds, lambda _s: True)
