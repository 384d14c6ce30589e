"""The governor's memory of breaches: which max-num-seqs values broke the SLO lately, read from the history.

The governor keeps no state of its own. Samples carry the value the engine ran with and a digest of its other
flags, so "the smallest value that broke the SLO (or a pressure condition) within ``remember``, under the
flags the replica runs now" is a function of the snapshot. The raise path never goes back to that value.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from controlplane.policy.conditions import ThresholdCondition
from controlplane.policy.detectors.slo import OPS
from controlplane.policy.snapshot import Replica, ReplicaSample


def _broke(samples: Sequence[ReplicaSample], cond: ThresholdCondition) -> bool:
    """Whether the condition held over some ``for``-long stretch of these samples."""
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


def breach_ceiling(replicas: Sequence[Replica], conds: Sequence[ThresholdCondition], remember: float,
                   now: datetime) -> int | None:
    """The smallest value at which the SLO (or a pressure condition) broke for its duration within ``remember``."""
    since = now - timedelta(seconds=remember)
    bad: list[int] = []
    for replica in replicas:
        # Only readings under the flags it runs now: a value that broke the SLO before a flag rung may meet it.
        key = replica.flags_key
        history = [s for s in replica.history if s.flags_key in (None, key)]
        # The running limit each reading ran under: a live cap where one was in effect, else --max-num-seqs.
        values = {v for s in history if (v := s.running_limit) is not None and s.at >= since}
        for value in values:
            samples = [s for s in history if s.running_limit == value and since <= s.at <= now]
            if any(_broke(samples, cond) for cond in conds):
                bad.append(value)
    return min(bad) if bad else None
