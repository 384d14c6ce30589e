"""Judging a canary: its p99 latencies and throughput over a window against its peers' over the same window.

Pure. A canary is worse when a judged latency p99 is more than ``max_latency_regression`` above the peers' or
its generation throughput more than ``max_throughput_drop`` below theirs. A latency figure is the median of
the per-sample values the agents reported (each already a p99 over the agent's own scrape window): those
readings are bursty (a wave of reconnecting clients prefilling at once lifts a few of them several-fold), and
a mean let one burst in the judged half-window fail a canary that was better in nearly every reading.
Throughput is the mean (it adds up: the mean rate is the window's tokens).

Which latencies are judged is the change's to say: a max-num-seqs change governed on inter-token latency is
judged on inter-token latency and throughput only, because a smaller batch under load is expected to move
queueing into TTFT (the trade the governor makes; ttft-slo alerts on TTFT itself). TTFT is still reported in
the figures. Without a say, both p99s are judged.

A change made to cut latency (a flag rung) also says how much it must cut: with ``min_latency_gain`` the
canary fails unless each judged latency is at least that share below the baseline's (the peers', or its own
before the change: whichever the caller hands in as ``peers``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from controlplane.policy.signals import ReplicaSample

# Signals (``policy.signals``) by name, as a change's judge names them.
LATENCIES = ("ttft_p99_seconds", "itl_p99_seconds")
THROUGHPUT = "generation_tokens_per_second"
MIN_SAMPLES = 2


@dataclass(frozen=True)
class CanaryVerdict:
    verdict: Literal["pass", "fail", "wait"]
    reason: str
    figures: dict[str, float | None]


def figure(samples: Sequence[ReplicaSample], key: str) -> float | None:
    """The median reading of a latency signal, the mean of the throughput; None without readings."""
    values = [float(v) for s in samples if (v := getattr(s, key)) is not None]
    if not values:
        return None
    return statistics.median(values) if key != THROUGHPUT else sum(values) / len(values)


def judge_canary(canary: Sequence[ReplicaSample], peers: Sequence[Sequence[ReplicaSample]],
                 max_latency_regression: float, max_throughput_drop: float, latencies: Sequence[str] = LATENCIES, *,
                 min_latency_gain: float | None = None) -> CanaryVerdict:
    """Compare the canary's window to its peers' (one sequence of samples per peer) on ``latencies``
    and throughput; the other latency p99s are reported, not judged."""
    if not peers:
        return CanaryVerdict("pass", "no peers to compare with: the canary converged", {})
    if len(canary) < MIN_SAMPLES:
        return CanaryVerdict("wait", f"{len(canary)} canary sample(s) in the window, need {MIN_SAMPLES}", {})
    pooled = [s for peer in peers for s in peer]
    figures: dict[str, float | None] = {}
    problems: list[str] = []
    for key in (*LATENCIES, THROUGHPUT):
        mine, theirs = figure(canary, key), figure(pooled, key)
        figures[f"canary_{key}"], figures[f"peers_{key}"] = mine, theirs
        if key in latencies and min_latency_gain is not None and (mine is None or not theirs):
            problems.append(f"no {key} reading {'of the canary' if mine is None else 'in the baseline'}: "
                            "a gain cannot be shown")
            continue
        if mine is None or theirs is None or theirs <= 0:
            continue
        ratio = mine / theirs
        if key in latencies and min_latency_gain is not None and ratio > 1 - min_latency_gain:
            problems.append(f"{key} {mine:.4g} vs baseline {theirs:.4g} ({ratio - 1:+.0%}; the change must cut "
                            f"it by {min_latency_gain:.0%})")
        elif key in latencies and ratio > 1 + max_latency_regression:
            problems.append(f"{key} {mine:.4g} vs peers {theirs:.4g} (+{ratio - 1:.0%}, "
                            f"allowed +{max_latency_regression:.0%})")
        if key == THROUGHPUT and ratio < 1 - max_throughput_drop:
            problems.append(f"{key} {mine:.4g} vs peers {theirs:.4g} ({ratio - 1:.0%}, "
                            f"allowed -{max_throughput_drop:.0%})")
    if problems:
        return CanaryVerdict("fail", "canary worse than its peers: " + "; ".join(problems), figures)
    judged = " and ".join(k.removesuffix("_seconds").replace("_", " ") for k in latencies if k in LATENCIES)
    if min_latency_gain is not None:
        return CanaryVerdict("pass", f"canary cut {judged or 'latency'} by at least {min_latency_gain:.0%} against "
                             "its baseline without losing throughput", figures)
    return CanaryVerdict("pass", f"canary no worse than its peers on {judged + ' and ' if judged else ''}"
                         "throughput", figures)
