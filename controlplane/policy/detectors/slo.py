"""SLO detectors: a signal beyond its threshold for a whole duration; the error ratio over a window."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import partial
from itertools import islice
from operator import attrgetter

from controlplane.policy.conditions import ErrorRateCondition, Op, ThresholdCondition
from controlplane.policy.detectors.findings import Finding, covering, covering_span, due_at, evidence_of, upto
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Replica, ReplicaSample

OPS: dict[Op, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}
# The same comparisons with their operands swapped: ``partial(REFLECTED[op], threshold)(v)`` is
# ``OPS[op](v, threshold)`` as a C call, for the checks that read every sample of a long window.
REFLECTED: dict[Op, Callable[[float, float], bool]] = {
    ">": operator.lt, ">=": operator.le, "<": operator.gt, "<=": operator.ge,
}


def bounds(values: Sequence[object]) -> tuple[float, float] | None:
    """(lowest, highest) of ``values`` as floats when every one is a finite number; None otherwise (one missing,
    not a number, or not finite: those are read one by one).

    Every check of a window reads each value as a float against a threshold, and ``float`` keeps the order of
    finite numbers: the whole window is beyond a threshold when its extreme is, and some value is when the other
    extreme is. A long window is judged on its bounds, read by C loops, not value by value.
    """
    if not values:
        return None
    try:
        if not math.isfinite(sum(values)):  # type: ignore[arg-type]
            return None  # a NaN, or an infinity
        return float(min(values)), float(max(values))  # type: ignore[type-var, arg-type]
    except (TypeError, OverflowError):
        return None  # a missing reading, or a number no float holds


def some_beyond(values: Sequence[object], op: Op, threshold: float) -> bool:
    """Whether some reading among ``values`` is ``op threshold`` (a missing one is not)."""
    extremes = bounds(values)
    if extremes is not None:
        return OPS[op](extremes[1] if op[0] == ">" else extremes[0], threshold)
    return any(OPS[op](float(v), threshold) for v in values if v is not None)  # type: ignore[arg-type]


def all_beyond(values: Sequence[object], op: Op, threshold: float) -> bool:
    """Whether every reading among ``values`` is ``op threshold``; a missing one is not."""
    extremes = bounds(values)
    if extremes is not None:
        return OPS[op](extremes[0] if op[0] == ">" else extremes[1], threshold)
    return None not in values and all(map(partial(REFLECTED[op], threshold), map(float, values)))  # type: ignore[arg-type]


def values_of(samples: Iterable[ReplicaSample], signal: str) -> list[object]:
    """Each sample's reading of ``signal``, in their order (None where it has none)."""
    return list(map(attrgetter(signal), samples))


class Column:
    """One signal's readings of a run of samples (None where a sample has none), judged a window at a time.

    A window's check asks the whole run first: when every reading of the run is a finite number on the right side
    of the threshold (or none is beyond it, or none was read), so is every window's, and no window is read. On a
    calm fleet that is one look at each history for every check of the round.
    """

    __slots__ = ("_bounds", "_missing", "values")

    def __init__(self, values: list[object]) -> None:
        self.values = values
        self._bounds: tuple[float, float] | bool | None = False  # False: not read yet
        self._missing: bool | None = None

    def _whole(self) -> tuple[float, float] | None:
        if self._bounds is False:
            self._bounds = bounds(self.values)
        return self._bounds  # type: ignore[return-value]

    def _none_read(self) -> bool:
        if self._missing is None:
            self._missing = self.values.count(None) == len(self.values)
        return self._missing

    def some(self, first: int, end: int, op: Op, threshold: float) -> bool:
        """``some_beyond`` of the readings ``[first:end]``."""
        whole = self._whole()
        if whole is not None and not OPS[op](whole[1] if op[0] == ">" else whole[0], threshold):
            return False  # no reading of the run is beyond
        if whole is None and self._none_read():
            return False
        return some_beyond(self.values[first:end], op, threshold)

    def every(self, first: int, end: int, op: Op, threshold: float, *, missing: bool = False) -> bool:
        """``all_beyond`` of the readings ``[first:end]``; with ``missing``, of those read (a missing one passes)."""
        whole = self._whole()
        if whole is not None and OPS[op](whole[0] if op[0] == ">" else whole[1], threshold):
            return True  # every reading of the run is beyond
        if whole is None and self._none_read():
            return missing or not self.values[first:end]
        window = self.values[first:end]
        return all_beyond([v for v in window if v is not None] if missing else window, op, threshold)


def beyond(signal: str, op: Op, threshold: float) -> Callable[[ReplicaSample], bool]:
    """Whether one sample reads ``signal op threshold``; a missing reading does not (unknown is not a breach,
    nor a recovery)."""

    read = attrgetter(signal)
    compare = OPS[op]

    def holds(sample: ReplicaSample) -> bool:
        value = read(sample)
        return value is not None and compare(float(value), threshold)

    return holds


def signal_holds(samples: list[ReplicaSample], now: datetime, signal: str, op: Op, threshold: float,
                 seconds: float) -> list[ReplicaSample] | None:
    """The covering samples when ``signal op threshold`` held in every one over ``seconds``; a missing
    reading breaks the run (``findings.held_for`` of ``beyond``)."""
    span = signal_span(samples, now, signal, op, threshold, seconds)
    return None if span is None else list(samples[span[0]:span[1]])


def signal_span(samples: Sequence[ReplicaSample], now: datetime, signal: str, op: Op, threshold: float,
                seconds: float, column: Column | None = None) -> tuple[int, int] | None:
    """Where ``signal_holds``'s run begins and ends in ``samples`` (bounds, not a copy), or None. The newest
    sample is judged first, then the window at once (``column``: the samples' readings of ``signal`` when the
    caller has them): the raise path reads a quarter of an hour of every replica, every round."""
    end = upto(samples, now)
    if end == 0 or not beyond(signal, op, threshold)(samples[end - 1]):
        return None
    span = covering_span(samples, now, seconds)
    if span is None:
        return None
    first, end = span
    held = (all_beyond(values_of(samples[first:end], signal), op, threshold) if column is None
            else column.every(first, end, op, threshold))
    return span if held else None


def signal_share_holds(samples: list[ReplicaSample], now: datetime, signal: str, op: Op, threshold: float,
                       seconds: float, share: float) -> list[ReplicaSample] | None:
    """The covering samples when ``signal op threshold`` held in at least ``share`` of them over ``seconds``
    (samples without a reading do not count either way); ``share`` 1 is ``signal_holds``."""
    if share >= 1:
        return signal_holds(samples, now, signal, op, threshold, seconds)
    run = covering(samples, now, seconds)
    if run is None:
        return None
    known = [float(v) for s in run if (v := getattr(s, signal)) is not None]
    beyond = sum(1 for v in known if OPS[op](v, threshold))
    return run if known and beyond >= share * len(known) else None


def detect_threshold(cond: ThresholdCondition, replica: Replica, now: datetime,
                     samples: list[ReplicaSample] | None = None) -> Finding | None:
    """A finding when the condition's signal was beyond its threshold for the whole duration (in
    ``min_share`` of the samples over it)."""
    history = replica.history if samples is None else samples
    run = signal_share_holds(history, now, cond.signal, cond.op, cond.threshold, cond.for_, cond.min_share)
    if run is None:
        return None
    values = [float(v) for s in run if (v := getattr(s, cond.signal)) is not None]
    latest = values[-1]
    beyond = sum(1 for v in values if OPS[cond.op](v, cond.threshold))
    share = "" if cond.min_share >= 1 else f" in {beyond} of {len(values)} samples"
    return Finding(
        detector="threshold",
        subject=replica.key,
        summary=f"{cond.signal} {cond.op} {cond.threshold:g}{share} for {format_duration(cond.for_)} "
        f"(now {latest:.4g}, worst {max(values) if cond.op[0] == '>' else min(values):.4g})",
        measured={"latest": latest, "max": max(values), "min": min(values), "samples": len(run),
                  "beyond": beyond},
        evidence=evidence_of(run, [cond.signal]),
    )


def threshold_due(cond: ThresholdCondition, replica: Replica, now: datetime) -> datetime | None:
    """When ``detect_threshold`` finds the breach under way if it goes on (``findings.due_at``); None when there
    is none under way, or when only a share of the samples must cross (no moment can be told in advance)."""
    if cond.min_share < 1:
        return None
    return due_at(replica.history, now, cond.for_, beyond(cond.signal, cond.op, cond.threshold))


def detect_error_rate(cond: ErrorRateCondition, replica: Replica, now: datetime) -> Finding | None:
    """A finding when errors per request over the window exceed the threshold, at meaningful traffic."""
    span = covering_span(replica.history, now, cond.for_)
    if span is None:
        return None
    first, end = span
    known = [(e, r) for s in islice(replica.history, first, end)
             if (e := s.errors_per_second) is not None and (r := s.requests_per_second) is not None]
    if len(known) < max(2, (end - first) // 2):
        return None
    each_errors, each_requests = zip(*known, strict=True)
    errors, requests = sum(each_errors), sum(each_requests)
    if requests / len(known) < cond.min_requests_per_second or requests <= 0:
        return None
    ratio = errors / requests
    if ratio <= cond.threshold:
        return None
    return Finding(
        detector="error_rate",
        subject=replica.key,
        summary=f"error ratio {ratio:.3%} over {format_duration(cond.for_)} (threshold {cond.threshold:.3%})",
        measured={"error_ratio": ratio, "requests_per_second": requests / len(known)},
        evidence=evidence_of(replica.history[first:end], ["errors_per_second", "requests_per_second"]),
    )
