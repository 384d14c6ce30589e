"""The governor's memory of breaches: which max-num-seqs values broke the SLO lately, read from the history;
and the rest of what its raise path reads there (how long each replica has met the SLO with margin).

The governor keeps no state of its own. Samples carry the value the engine ran with and a digest of its other
flags, so "the smallest value that broke the SLO (or a pressure condition) within ``remember``, under the
flags the replica runs now" is a function of the snapshot. The raise path never goes back to that value.

On a calm fleet every replica's last ``remember`` is read each round, so a replica's history is read as the
round's ``Readings``: what values and flags it ran under, told once, and each signal's readings pulled out once
for every check that needs them; a stretch is judged on its extremes first (``slo.bounds``), and a window slides
only over a stretch with a reading beyond the threshold. ``Raising`` reads each replica while its history is at
hand, in the same pass as the breach checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from functools import partial
from itertools import islice
from operator import attrgetter, itemgetter
from typing import NamedTuple

from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import Op, ThresholdCondition
from controlplane.policy.detectors.findings import between, first_from, since, upto
from controlplane.policy.detectors.slo import OPS, Column, signal_span, values_of
from controlplane.policy.snapshot import Replica, ReplicaSample

# The condition met, for each way of breaching it.
INVERSE: dict[Op, Op] = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}


class Stretch(NamedTuple):
    """A replica's readings at one value: ``samples[first:end]``, and each signal's readings of ``samples``.

    Bounds, not a copy: a copy of a history touches every sample, and a round reads thousands of histories."""

    value: int
    samples: Sequence[ReplicaSample]
    first: int
    end: int
    column: Callable[[str], Column]


_MAX_NUM_SEQS, _LIVE_CAP, _FLAGS_KEY = attrgetter("max_num_seqs"), attrgetter("live_cap"), attrgetter("flags_key")


class Readings:
    """One replica's history as the governor reads it: a function of the replica alone, so it is kept across
    rounds for as long as the snapshot hands over the very same replica object (``KeptReadings``).

    ``uniform``: no reading under a live cap, and none under other flags than the replica runs now (the usual
    history); then the readings at a value are the whole history or none of it, told from the set of values.
    """

    __slots__ = ("_columns", "_view", "_view_columns", "history", "replica", "uniform", "values")

    def __init__(self, replica: Replica) -> None:
        history = replica.history
        self.replica = replica
        self.history = history
        # C loops over the samples (a 1,000-node fleet: 8,000 histories each round).
        self.values = set(map(_MAX_NUM_SEQS, history))
        self.uniform = (set(map(_LIVE_CAP, history)) <= {None}
                        and set(map(_FLAGS_KEY, history)) <= {None, replica.flags_key})
        self._columns: dict[str, Column] = {}
        self._view: tuple[int, list[ReplicaSample]] | None = None
        self._view_columns: dict[str, Column] = {}

    def column(self, signal: str) -> Column:
        """Every sample's reading of ``signal``, in the history's order (None where it has none)."""
        found = self._columns.get(signal)
        if found is None:
            found = self._columns[signal] = Column(values_of(self.history, signal))
        return found

    def at_value(self, value: int) -> list[ReplicaSample]:
        """``governor.at_value``: the readings under ``value`` and the flags the replica runs now (the history
        itself when every reading is); the last value asked is kept."""
        if self._view is None or self._view[0] != value:
            self._view, self._view_columns = (value, self._at_value(value)), {}
        return self._view[1]

    def _at_value(self, value: int) -> list[ReplicaSample]:
        if self.uniform and self.values <= {None, value}:
            return self.history
        key = self.replica.flags_key
        return [s for s in self.history if (s.max_num_seqs if (cap := s.live_cap) is None else cap) in (None, value)
                and s.flags_key in (None, key)]

    def value_column(self, value: int, signal: str) -> Column:
        """``signal``'s readings of ``at_value(value)``."""
        view = self.at_value(value)
        if view is self.history:
            return self.column(signal)
        found = self._view_columns.get(signal)
        if found is None:
            found = self._view_columns[signal] = Column(values_of(view, signal))
        return found

    def stretches(self, since: datetime, now: datetime) -> list[Stretch]:
        """The readings of ``since`` to ``now`` under the flags the replica runs now, by the running limit each
        ran under (a live cap where one was in effect, else --max-num-seqs); a value read only after ``now``
        has no reading."""
        history = self.history
        lo = first_from(history, since)
        hi = max(lo, upto(history, now))
        if self.uniform and len(self.values) == 1:
            value = next(iter(self.values))
            if value is None or lo == len(history):
                return []
            return [Stretch(value, history, lo, hi, self.column)]
        key = self.replica.flags_key
        by: dict[int, list[ReplicaSample]] = {}
        for i, s in enumerate(islice(history, lo, None), start=lo):
            limit = s.running_limit
            if limit is not None and s.flags_key in (None, key):
                samples = by.setdefault(limit, [])
                if i < hi:
                    samples.append(s)
        return [Stretch(value, samples, 0, len(samples), partial(_column_of, samples)) for value, samples in by.items()]


class KeptReadings:
    """``Readings`` kept from one round to the next for the replica objects they were read from: a snapshot that
    keeps an unchanged node's objects (``remediation.snapshot.FleetRows``) spares the governor re-reading its
    histories, their values, flags and columns, each round."""

    def __init__(self) -> None:
        self._by_id: dict[int, Readings] = {}  # by the replica object (each held by its Readings: ids stay theirs)

    def of(self, replica: Replica) -> Readings:
        found = self._by_id.get(id(replica))
        if found is None:
            found = self._by_id[id(replica)] = Readings(replica)
        return found

    def keep_only(self, replicas: Iterable[Replica]) -> None:
        """Forget the readings of every replica object but these (a round's)."""
        by_id = self._by_id
        self._by_id = {id(r): found for r in replicas if (found := by_id.get(id(r))) is not None}

    def clear(self) -> None:
        self._by_id.clear()


def _column_of(samples: Sequence[ReplicaSample], signal: str) -> Column:
    return Column(values_of(samples, signal))


def _broke(stretch: Stretch, cond: ThresholdCondition) -> bool:
    """Whether the condition held over some ``for``-long stretch of these readings."""
    if cond.min_share > 0 and not stretch.column(cond.signal).some(stretch.first, stretch.end, cond.op,
                                                                   cond.threshold):
        # No reading beyond the threshold (the usual history): no share of a window is, and no breach lasted.
        return cond.min_share >= 1 and cond.for_ <= 0.0
    samples = stretch.samples[stretch.first:stretch.end]
    if cond.min_share >= 1:
        return _longest_breach(samples, cond) >= cond.for_
    known = [(s.at, OPS[cond.op](float(v), cond.threshold)) for s in samples
             if (v := getattr(s, cond.signal)) is not None]
    start, beyond = 0, 0
    for end, (at, hit) in enumerate(known):  # a sliding window of ``for`` seconds ending at each sample
        beyond += hit
        while (at - known[start][0]).total_seconds() > cond.for_:
            beyond -= known[start][1]
            start += 1
        spans = start > 0 or (at - known[0][0]).total_seconds() >= cond.for_
        if spans and beyond >= cond.min_share * (end - start + 1):
            return True
    return False


def _longest_breach(samples: Sequence[ReplicaSample], cond: ThresholdCondition) -> float:
    longest, start = 0.0, None
    for s in samples:
        value = getattr(s, cond.signal)
        if value is not None and OPS[cond.op](float(value), cond.threshold):
            start = start or s.at
            longest = max(longest, (s.at - start).total_seconds())
        else:
            start = None
    return longest


def lowest_broken(history: Readings, conds: Sequence[ThresholdCondition], since: datetime,
                  now: datetime) -> int | None:
    """The smallest value at which one replica's readings of ``since`` to ``now`` broke the SLO (or a pressure
    condition) for its duration; values are judged smallest first, and no larger one is read."""
    for stretch in sorted(history.stretches(since, now), key=itemgetter(0)):
        if any(_broke(stretch, cond) for cond in conds):
            return stretch.value
    return None


def ceiling_of(lowest: Iterable[int | None]) -> int | None:
    """The smallest of the replicas' ``lowest_broken`` values, None when none broke."""
    broken = [value for value in lowest if value is not None]
    return min(broken) if broken else None


def breach_ceiling(replicas: Sequence[Replica], conds: Sequence[ThresholdCondition], remember: float,
                   now: datetime) -> int | None:
    """The smallest value at which the SLO (or a pressure condition) broke for its duration within ``remember``."""
    since = now - timedelta(seconds=remember)
    return ceiling_of(lowest_broken(Readings(r), conds, since, now) for r in replicas)


def comfortable(cond: ThresholdCondition, margin: float) -> float:
    """The condition's threshold with ``margin`` (the raise path's): under it, or over it for a floor."""
    return cond.threshold * margin if cond.op[0] == ">" else cond.threshold / margin


def comfortable_run(cond: ThresholdCondition, action: LowerMaxNumSeqsAction, history: Readings, value: int,
                    now: datetime) -> tuple[int, int] | None:
    """Where the readings at the replica's ``value`` over ``raise.for`` are (bounds in ``at_value(value)``) when
    the SLO was met with margin in every one, and every pressure signal was calm as long; else None."""
    spec = action.raise_
    assert spec is not None
    samples = history.at_value(value)
    run = signal_span(samples, now, cond.signal, INVERSE[cond.op], comfortable(cond, spec.margin), spec.for_,
                      history.value_column(value, cond.signal))
    if run is None:
        return None
    # Every pressure signal must be comfortable too: no reading over its threshold x margin for as long (a
    # missing reading is a calm one: the agent leaves a zero preemption rate off the wire).
    first, end = between(samples, now - timedelta(seconds=spec.for_), now)
    if all(history.value_column(value, p.signal).every(first, end, INVERSE[p.op], comfortable(p, spec.margin),
                                                        missing=True) for p in action.pressure):
        return run
    return None


# A replica that can go up: (replica, its value, the value up, where its comfortable run is).
Candidate = tuple[Replica, int, int, tuple[int, int]]


class Raising:
    """The raise path's reading of a model, gathered a replica at a time while its history is at hand (the caller
    stops when a change in flight rules a raise out). After a breach (the model is most likely lowered instead)
    replicas are only noted, and read if the model is raised after all."""

    def __init__(self, cond: ThresholdCondition, action: LowerMaxNumSeqsAction, step_up: Callable[[int], int | None],
                 now: datetime) -> None:
        assert action.raise_ is not None
        self.cond, self.action, self.step_up, self.now = cond, action, step_up, now
        self.conds, self.since = [cond, *action.pressure], now - timedelta(seconds=action.raise_.remember)
        self.paused = False
        self._ups: dict[int, int | None] = {}
        self._lowest: dict[int, int | None] = {}
        self._pending: list[tuple[Replica, Readings, int]] = []
        self._candidates: list[Candidate] = []

    def consider(self, replica: Replica, history: Readings, value: int) -> None:
        """Whether the replica can go up from ``value`` (a step up, the SLO met with margin for ``raise.for``);
        and, once some replica can, the smallest value that broke the SLO lately on it."""
        if self.paused:
            self._pending.append((replica, history, value))
            return
        if value not in self._ups:
            self._ups[value] = self.step_up(value)
        up = self._ups[value]
        run = None if up is None else comfortable_run(self.cond, self.action, history, value, self.now)
        if up is not None and run is not None:
            self._candidates.append((replica, value, up, run))
        if self._candidates:
            # Some replica can go up: what broke the SLO lately matters; read it while this history is at hand.
            self._lowest[id(replica)] = lowest_broken(history, self.conds, self.since, self.now)

    def chosen(self, replicas: Sequence[Replica], read: dict[int, Readings]) -> tuple[Candidate, int | None] | None:
        """The replica to raise (its value the lowest, then its name the first) among those whose step up did not
        break the SLO lately, with the smallest value that did; None when none can go up."""
        self.paused = False
        for replica, history, value in self._pending:
            self.consider(replica, history, value)
        if not self._candidates:
            return None  # no replica could go up: what broke the SLO lately does not matter
        ceiling = ceiling_of(self._lowest[id(r)] if id(r) in self._lowest
                             else lowest_broken(read[id(r)], self.conds, self.since, self.now) for r in replicas)
        # Settled: the next step up broke the SLO recently.
        candidates = [c for c in self._candidates if not (ceiling is not None and c[2] >= ceiling)]
        if not candidates:
            return None
        return min(candidates, key=lambda c: (c[1], c[0].key)), ceiling


# Each replica's readings at its current value (``Readings.at_value``), by replica.
Views = dict[int, list[ReplicaSample]]


def _rates(samples: Sequence[ReplicaSample], now: datetime, seconds: float) -> list[float]:
    return [v for s in since(samples, now - timedelta(seconds=seconds), now)
            if (v := s.generation_tokens_per_second) is not None]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def throughput_ratios(replicas: Sequence[Replica], cur: dict[str, int], views: Views, seconds: float,
                      now: datetime) -> Callable[[Replica], float | None]:
    """Each of ``replicas``' generation throughput over the last ``seconds`` against that of its peers at higher
    values (all their readings pooled), each replica's readings gathered once: a model of thousands of replicas
    compares each lowered one against all those above it."""
    rates: dict[int, list[float]] = {}
    theirs: dict[int, float | None] = {}

    def of(replica: Replica) -> list[float]:
        if id(replica) not in rates:
            rates[id(replica)] = _rates(views[id(replica)], now, seconds)
        return rates[id(replica)]

    def ratio(replica: Replica) -> float | None:
        # The peers above a value are the same whichever replica runs it (the replica itself is never above).
        value = cur[replica.key]
        if value not in theirs:
            theirs[value] = _mean([v for p in replicas if p.serving and cur[p.key] > value for v in of(p)])
        mine, above = _mean(of(replica)), theirs[value]
        if mine is None or above is None or above <= 0:
            return None
        return mine / above

    return ratio
