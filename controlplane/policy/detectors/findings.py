"""What a detector returns: a finding, its measured figures and the samples that triggered it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

# Evidence kept per finding: enough to see the shape of a series, small enough for a page.
EVIDENCE_POINTS = 12
# A history whose newest sample is older than this is a node that stopped reporting, not a signal.
STALE_AFTER_SECONDS = 180.0

Value = float | int | bool | str | list[str] | None
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


def held_for(samples: Sequence[T], now: datetime, seconds: float, holds: Callable[[T], bool]) -> list[T] | None:
    """The samples covering the last ``seconds`` if ``holds`` is true of every one of them, else None.

    Coverage needs an anchor: a sample at or before ``now - seconds``; without one the history is too short
    to say the condition held for the whole duration. A stale history (no recent sample) or one with a
    reporting gap inside the window never holds.
    """
    start = now - timedelta(seconds=seconds)
    past = [s for s in samples if s.at <= now]
    if not past or (now - past[-1].at).total_seconds() > STALE_AFTER_SECONDS:
        return None
    anchor = next((i for i in range(len(past) - 1, -1, -1) if past[i].at <= start), None)
    if anchor is None:
        return None
    covering = past[anchor:]
    if any((b.at - a.at).total_seconds() > STALE_AFTER_SECONDS for a, b in pairwise(covering)):
        return None  # a reporting gap: nobody saw what happened in it
    return covering if all(holds(s) for s in covering) else None


def covering(samples: Sequence[T], now: datetime, seconds: float) -> list[T] | None:
    """The samples covering the last ``seconds`` (with their anchor), or None when history is too short."""
    return held_for(samples, now, seconds, lambda _s: True)
