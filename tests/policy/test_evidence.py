"""The canary's evidence: the rank statistic on histogram buckets, its spread by engine steps, and the sequential
judge's error rates over a whole window."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.policy.evidence import MIN_N, boundary, greater, judge_evidence, pool, rank_test
from tests.policy.windows import ITL_BOUNDS, SCRAPE, engine_steps, stream, window

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ITL = ["itl_p99_seconds"]


@pytest.mark.parametrize(("x", "y"), [
    ((0.05, 0.075), (0.05, 0.075)),  # the same bucket
    ((0.05, 0.075), (0.055, 0.0825)),  # a bucket against one scaled by 1.1
    ((0.075, 0.1), (0.0, 0.01)),  # disjoint
    ((0.01, 0.025), (0.02, 0.3)),  # one inside the other
    ((80.0, 80.0), (40.0, 88.0)),  # the +Inf bucket (a point) against a scaled bucket
    ((40.0, 80.0), (80.0, 80.0)),
    ((1.0, 1.0), (1.0, 1.0)),
])
def test_the_chance_one_bucket_beats_another_is_what_drawing_from_them_gives(x, y):
    rng = random.Random(7)
    draws = 200_000
    hits = 0.0
    for _ in range(draws):
        a, b = rng.uniform(*x), rng.uniform(*y)
        hits += 1.0 if a > b else 0.5 if a == b else 0.0
    assert greater(x, y) == pytest.approx(hits / draws, abs=0.005)
    assert greater(x, y) + greater(y, x) == pytest.approx(1.0)


def test_a_canary_like_its_peers_sits_at_one_half_and_a_slower_one_above():
    rng = random.Random(1)
    peers = pool(stream(rng, T0, 6, median=0.06), "itl")
    same = pool(stream(rng, T0, 6, median=0.06), "itl")
    slow = pool(stream(rng, T0, 6, median=0.09), "itl")
    assert rank_test("itl", peers, peers, 1.0).effect == pytest.approx(0.5)  # exactly, by symmetry
    assert rank_test("itl", same, peers, 1.0).effect == pytest.approx(0.5, abs=0.06)
    assert rank_test("itl", slow, peers, 1.1).effect > 0.65  # 1.5 times slower, in coarse buckets
    # Within the allowed 10 %: a canary like its peers is typically inside 1.1 times them.
    assert rank_test("itl", same, peers, 1.1).effect < 0.45


def test_inter_token_latency_counts_engine_steps_not_tokens():
    # 6 windows of 40 steps with 8 requests each: 1,920 tokens, 240 independent draws.
    rng = random.Random(2)
    with_steps = pool(stream(rng, T0, 6, median=0.06), "itl")
    assert with_steps.total == 6 * 40 * 8 and with_steps.n("itl") == 6 * 40
    # Without a step count (an engine lacking vllm:iteration_tokens_total) the tokens are no evidence at all:
    # counted as independent they would give verdicts on noise.
    without = pool(stream(rng, T0, 6, median=0.06, with_steps=False), "itl")
    assert without.steps is None and without.n("itl") is None
    assert rank_test("itl", with_steps, without, 1.0) is None
    verdict = judge_evidence(stream(rng, T0, 6, median=0.2, with_steps=False),
                             [stream(rng, T0, 6, median=0.06, with_steps=False)], since=T0,
                             baseline_since=T0, latencies=ITL, ratio=1.1, max_throughput_drop=0.25, alpha=0.05,
                             looks=24)
    assert verdict.verdict == "wait" and "no step count" in verdict.reason


def test_a_window_is_counted_once_however_many_reports_carry_it():
    rng = random.Random(3)
    one = window(T0, engine_steps(rng, 40, 8, 0.06), steps=40)
    assert pool([one, one, one], "itl").total == 320  # the agent repeats its last reading until the next scrape
    assert pool([one], "itl", since=T0).windows == 0  # it began before ``since``: it straddles the change


def test_windows_with_other_bounds_still_pool():
    upgraded = window(T0 + SCRAPE, [0.06] * 30, steps=30, itl_bounds=(0.05, 0.1))
    pooled = pool([window(T0, [0.06] * 30, steps=30), upgraded], "itl")
    assert pooled.total == 60 and set(pooled.buckets) == {(0.05, 0.075), (0.05, 0.1)}


def _run(rng: random.Random, canary_median: float, *, ratio: float, looks: int = 24, batch: int = 8,
         peers: int = 2) -> tuple[str, int]:
    """One canary judged at each of ``looks`` windows against ``peers`` peers at median 60 ms: the verdict and
    the look that gave it."""
    mine, theirs = [], [[] for _ in range(peers)]
    for look in range(1, looks + 1):
        at = T0 + look * SCRAPE
        mine.append(window(at, engine_steps(rng, 40, batch, canary_median), steps=40))
        for peer in theirs:
            peer.append(window(at, engine_steps(rng, 40, batch, 0.06), steps=40))
        verdict = judge_evidence(mine, theirs, since=T0, baseline_since=T0, latencies=ITL, ratio=ratio,
                                 max_throughput_drop=0.25, alpha=0.05, looks=looks)
        if verdict.verdict != "wait":
            return verdict.verdict, look
    return "wait", looks


def test_over_a_whole_window_a_canary_no_different_from_its_peers_is_rarely_given_a_verdict():
    # θ at exactly one half (ratio 1, the same engine): any verdict is a wrong one. With 8 requests a step,
    # counting tokens as independent would give a verdict in most runs; counting steps keeps it under alpha.
    rng = random.Random(11)
    verdicts = [_run(rng, 0.06, ratio=1.0)[0] for _ in range(200)]
    assert sum(v != "wait" for v in verdicts) / len(verdicts) <= 0.05


def test_a_clearly_slower_canary_fails_within_a_few_windows_and_a_clearly_faster_one_passes():
    rng = random.Random(12)
    slower = [_run(rng, 0.09, ratio=1.1) for _ in range(50)]
    assert all(v == "fail" for v, _ in slower)
    assert max(look for _, look in slower) <= 2
    faster = [_run(rng, 0.045, ratio=1.1) for _ in range(50)]
    assert all(v == "pass" for v, _ in faster)
    # Three windows of throughput are the least a pass waits for.
    assert max(look for _, look in faster) == 3


def test_a_canary_like_its_peers_passes_against_the_allowed_regression():
    rng = random.Random(13)
    runs = [_run(rng, 0.06, ratio=1.1) for _ in range(50)]
    assert sum(v == "pass" for v, _ in runs) >= 48 and not any(v == "fail" for v, _ in runs)


def test_the_judge_waits_for_enough_observations_and_says_so():
    few = [window(T0 + SCRAPE, [0.06] * 5, steps=5)]
    verdict = judge_evidence(few, [few], since=T0, baseline_since=T0, latencies=ITL, ratio=1.1,
                             max_throughput_drop=0.25, alpha=0.05, looks=24)
    assert verdict.verdict == "wait" and f"need {MIN_N} a side" in verdict.reason


def test_a_canary_that_lost_too_much_throughput_fails_even_with_better_latency():
    rng = random.Random(14)
    mine = stream(rng, T0, 4, median=0.04, tps=50)
    theirs = [stream(rng, T0, 4, median=0.06, tps=100)]
    verdict = judge_evidence(mine, theirs, since=T0, baseline_since=T0, latencies=ITL, ratio=1.1,
                             max_throughput_drop=0.25, alpha=0.05, looks=24)
    assert verdict.verdict == "fail" and "generation_tokens_per_second" in verdict.reason
    assert verdict.figures["itl_effect"] is not None and verdict.figures["z_boundary"] == pytest.approx(3.08, abs=0.01)


def test_the_boundary_widens_with_the_looks():
    assert boundary(0.05, 1) == pytest.approx(1.96, abs=0.01)
    assert boundary(0.05, 24) > boundary(0.05, 12) > boundary(0.05, 1)


def test_itl_bounds_are_vllms():
    # The bounds the judge is tested on are the ones a recorded engine reports.
    text = Path("tests/fixtures/vllm-0.32.0-cpu/metrics-warm.txt").read_text()
    les = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
           if line.startswith("vllm:inter_token_latency_seconds_bucket")]
    assert tuple(float(le) for le in les if le != "+Inf") == ITL_BOUNDS
