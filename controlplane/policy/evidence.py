"""Judging a canary on evidence: a sequential rank test of its per-request latencies against its baseline's.

Pure. The statistics are set out in docs/design.md (Canary evidence); in short:

- **The data.** Every scrape window an engine reports its TTFT and inter-token latency histograms over that
  window (``agent.wire.EngineWindow``). Pooled over the judged period, the canary's and its baseline's (the
  peers', or its own before the change) are two samples of latencies, each known to its bucket.
- **The statistic.** ``θ = P(X > k·Y)`` for X a canary observation and Y a baseline one: the Mann-Whitney
  probability of the canary against the baseline scaled by ``k``, the ratio it may reach (``1 +
  max_latency_regression``; ``1 - min_latency_gain`` for a change that must cut latency). Inside a bucket the
  observations are taken as spread evenly, as ``histogram_quantile`` takes them; the +Inf bucket is a point at
  the highest bound. θ below 1/2: the canary is typically within ``k`` times the baseline; above: beyond it.
- **Its spread.** With θ at 1/2, ``var(θ̂) = (n₁ + n₂ + 1) / (12 n₁ n₂)`` for independent observations. The
  tokens of one engine step are not independent (vLLM stamps every running request's token of a step with
  the same time), so the inter-token latency's n is the windows' engine steps when fewer than its tokens (an
  engine without a step count is not judged on it before the window's end); TTFT's n is its count.
- **Sequential looks.** The judge looks every round, at most ``looks`` times over the window; each look tests
  both ways at ``alpha / (2·looks)`` (Bonferroni), so over the whole window a canary no better and no worse than
  ``k`` times its baseline gets a wrong verdict with a chance of at most alpha. Pass: every judged latency has
  ``z < -z_b`` and the throughput holds; fail: one has ``z > z_b``, or the throughput fell too far. Otherwise
  the judge waits for more; at the window's end the p99 comparison (``canary.judge_canary``) decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import NormalDist
from typing import Literal

from agent.wire import EngineWindow
from controlplane.policy.canary import LATENCIES, THROUGHPUT, CanaryVerdict, figure
from controlplane.policy.signals import ReplicaSample

Interval = tuple[float, float]  # a bucket's (lower, upper) bound; a point when equal
Latency = Literal["ttft", "itl"]

# Fewer observations a side than this and the normal approximation of the rank statistic is not trusted.
MIN_N = 20
# Canary windows with a throughput figure before throughput is judged (15 s of readings at the default scrape).
MIN_THROUGHPUT_WINDOWS = 3
# The window's histogram of each judged latency signal.
_HISTOGRAMS: Mapping[str, Latency] = {"ttft_p99_seconds": "ttft", "itl_p99_seconds": "itl"}


@dataclass(frozen=True)
class Pooled:
    """One latency's observations over several windows, per bucket, and the engine steps that made them."""

    buckets: Mapping[Interval, float]
    windows: int
    steps: float | None  # None: a window lacked its step count

    @property
    def total(self) -> float:
        return sum(self.buckets.values())

    def __add__(self, other: Pooled) -> Pooled:
        buckets = dict(self.buckets)
        for interval, count in other.buckets.items():
            buckets[interval] = buckets.get(interval, 0.0) + count
        steps = None if self.steps is None or other.steps is None else self.steps + other.steps
        return Pooled(dict(buckets), self.windows + other.windows, steps)

    def n(self, latency: Latency) -> float | None:
        """How many independent observations the pool counts as: one per engine step for inter-token latency;
        None for inter-token latency without a step count, whose tokens cannot be taken as independent."""
        if latency == "itl":
            return None if self.steps is None else min(self.total, self.steps)
        return self.total


def _distinct(samples: Iterable[ReplicaSample]) -> tuple[dict[datetime, ReplicaSample], list[ReplicaSample]]:
    """The samples that name a scrape window, one per window (a window travels in every report until the next
    scrape), and the samples that name none (an agent that reports no windows)."""
    named: dict[datetime, ReplicaSample] = {}
    unnamed: list[ReplicaSample] = []
    for sample in samples:
        if sample.window is not None:
            named[sample.window.ended_at] = sample
        else:
            unnamed.append(sample)
    return named, unnamed


def _windows(samples: Iterable[ReplicaSample], since: datetime | None) -> list[EngineWindow]:
    """The distinct scrape windows in ``samples`` that began at ``since`` or later."""
    found = []
    for sample in _distinct(samples)[0].values():
        window = sample.window
        if window is not None and (since is None or window.ended_at.timestamp() - window.seconds
                                   >= since.timestamp()):
            found.append(window)
    return found


def pool(samples: Iterable[ReplicaSample], latency: Latency, since: datetime | None = None) -> Pooled:
    """``latency`` pooled over the distinct windows of ``samples`` that began at ``since`` or later. Pooled per
    bucket interval, so windows of an engine whose buckets changed still add up."""
    buckets: dict[Interval, float] = {}
    windows, steps = 0, 0.0
    counted_steps = True
    for window in _windows(samples, since):
        histogram = window.ttft if latency == "ttft" else window.itl
        if histogram is None:
            continue
        bounds = histogram.bounds
        for i, count in enumerate(histogram.counts):
            if count > 0:
                low = bounds[i - 1] if i > 0 else 0.0
                high = bounds[i] if i < len(bounds) else low  # above every bound: a point at the highest
                buckets[(low, high)] = buckets.get((low, high), 0.0) + count
        windows += 1
        if window.steps is None:
            counted_steps = False
        else:
            steps += window.steps
    return Pooled(buckets, windows, steps if counted_steps and windows else None)


def _survival_integral(a: float, b: float, lo: float, hi: float) -> float:
    """∫ P(X > y) dy over [lo, hi] for X spread evenly over [a, b] (a < b)."""
    below = max(0.0, min(hi, a) - lo)  # where y < a, P(X > y) = 1
    left, right = max(lo, a), min(hi, b)
    inside = ((b - left) ** 2 - (b - right) ** 2) / (2 * (b - a)) if right > left else 0.0
    return below + inside


def greater(x: Interval, y: Interval) -> float:
    """P(X > Y) + P(X = Y)/2 for X spread evenly over interval ``x`` and Y over ``y`` (a point when its bounds
    are equal)."""
    (a, b), (c, d) = x, y
    if a == b and c == d:
        return 1.0 if a > c else 0.5 if a == c else 0.0
    if c == d:  # Y a point: P(X > c)
        return 1.0 if c <= a else 0.0 if c >= b else (b - c) / (b - a)
    if a == b:  # X a point: P(Y < a)
        return 0.0 if a <= c else 1.0 if a >= d else (a - c) / (d - c)
    return _survival_integral(a, b, c, d) / (d - c)


@dataclass(frozen=True)
class RankTest:
    latency: Latency
    effect: float  # θ = P(canary > ratio times baseline)
    z: float
    n_canary: float
    n_baseline: float

    def figures(self) -> dict[str, float | None]:
        return {f"{self.latency}_effect": round(self.effect, 4), f"{self.latency}_z": round(self.z, 3),
                f"{self.latency}_n_canary": self.n_canary, f"{self.latency}_n_baseline": self.n_baseline}


def rank_test(latency: Latency, canary: Pooled, baseline: Pooled, ratio: float) -> RankTest | None:
    """θ and its z against 1/2; None while either side has fewer than ``MIN_N`` observations (or no count)."""
    n1, n2 = canary.n(latency), baseline.n(latency)
    if n1 is None or n2 is None or n1 < MIN_N or n2 < MIN_N:
        return None
    total1, total2 = canary.total, baseline.total
    effect = sum(c1 * c2 * greater(x, (ratio * y[0], ratio * y[1]))
                 for x, c1 in canary.buckets.items() for y, c2 in baseline.buckets.items()) / (total1 * total2)
    spread = math.sqrt((n1 + n2 + 1) / (12 * n1 * n2))
    return RankTest(latency, effect, (effect - 0.5) / spread, n1, n2)


def boundary(alpha: float, looks: int) -> float:
    """The |z| a look must pass for a verdict: each of ``looks`` looks tests both ways at alpha / (2·looks)."""
    return NormalDist().inv_cdf(1 - alpha / (2 * max(1, looks)))


def _throughput(samples: Iterable[ReplicaSample]) -> tuple[float | None, int]:
    """The mean generation rate over the distinct scrape windows of ``samples``, and how many there were (a
    reading that names no window counts only where none does: an agent that reports none)."""
    named, unnamed = _distinct(s for s in samples if s.generation_tokens_per_second is not None)
    rates = [s.generation_tokens_per_second for s in (list(named.values()) or unnamed)]
    known = [r for r in rates if r is not None]
    return (sum(known) / len(known) if known else None), len(known)


EMPTY = Pooled({}, 0, 0.0)


def judge_evidence(canary: Sequence[ReplicaSample], baseline: Sequence[Sequence[ReplicaSample]], *,
                   since: datetime | None, baseline_since: datetime | None, latencies: Sequence[str] = LATENCIES,
                   ratio: float, max_throughput_drop: float, alpha: float, looks: int) -> CanaryVerdict:
    """Pass, fail or wait on the evidence so far: the canary's samples (windows that began at ``since`` or
    later) against the baseline's (one sequence of samples per replica, pooled, from ``baseline_since``).
    ``ratio``: the k of θ = P(X > k·Y)."""
    z_b = boundary(alpha, looks)
    figures: dict[str, float | None] = {"z_boundary": round(z_b, 3), "ratio": ratio}
    # The p99 readings beside the evidence (the median of the agents' per-window p99s), as the window's end
    # would compare them: what an operator reads first.
    pooled = [s for samples in baseline for s in samples]
    for key in LATENCIES:
        figures[f"canary_{key}"], figures[f"peers_{key}"] = figure(canary, key), figure(pooled, key)
    tests: list[RankTest] = []
    waiting: list[str] = []
    for name in latencies:
        latency = _HISTOGRAMS.get(name)
        if latency is None:
            continue
        mine = pool(canary, latency, since)
        theirs = sum((pool(samples, latency, baseline_since) for samples in baseline), EMPTY)
        test = rank_test(latency, mine, theirs, ratio)
        if test is None:
            n1, n2 = mine.n(latency), theirs.n(latency)
            if n1 is None or n2 is None:
                waiting.append(f"{latency}: an engine reports no step count (an older vLLM, or SGLang), so its "
                               "tokens cannot be counted as independent: judged on p99s at the window's end")
            else:
                waiting.append(f"{latency}: n {n1:.0f} vs {n2:.0f}, need {MIN_N} a side")
            continue
        figures.update(test.figures())
        tests.append(test)
    worse = [t for t in tests if t.z > z_b]
    if worse:
        return CanaryVerdict("fail", "canary worse than its baseline on the evidence: " + "; ".join(
            _words(t, ratio, z_b) for t in worse), figures)
    undecided = [t for t in tests if t.z >= -z_b]
    if waiting or undecided or not tests:
        why = waiting + [_words(t, ratio, z_b) for t in undecided]
        return CanaryVerdict("wait", "evidence not yet in: " + ("; ".join(why) or "no latency judged"), figures)
    mine_rate, windows = _throughput(canary)
    peer_rates = [rate for samples in baseline if (rate := _throughput(samples)[0]) is not None]
    theirs_rate = sum(peer_rates) / len(peer_rates) if peer_rates else None
    figures[f"canary_{THROUGHPUT}"], figures[f"peers_{THROUGHPUT}"] = mine_rate, theirs_rate
    if windows < MIN_THROUGHPUT_WINDOWS or mine_rate is None or not theirs_rate:
        return CanaryVerdict("wait", f"latency evidence in; throughput from {windows} of "
                             f"{MIN_THROUGHPUT_WINDOWS} readings", figures)
    if mine_rate / theirs_rate < 1 - max_throughput_drop:
        return CanaryVerdict("fail", f"{THROUGHPUT} {mine_rate:.4g} vs baseline {theirs_rate:.4g} "
                             f"({mine_rate / theirs_rate - 1:.0%}, allowed -{max_throughput_drop:.0%})", figures)
    return CanaryVerdict("pass", "evidence in: " + "; ".join(_words(t, ratio, z_b) for t in tests)
                         + " and throughput holds", figures)


def _words(test: RankTest, ratio: float, z_b: float) -> str:
    return (f"{test.latency} P(canary > {ratio:.2f}x baseline) {test.effect:.2f}, z {test.z:+.1f} (verdict at "
            f"±{z_b:.2f}; n {test.n_canary:.0f} vs {test.n_baseline:.0f})")
