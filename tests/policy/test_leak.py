from datetime import timedelta

import pytest

from controlplane.policy.conditions import LeakCondition
from controlplane.policy.detectors.leak import detect_leak, theil_sen
from tests.policy.series import GiB, MiB, at, fleet, healthy, noise, replica

RSS = LeakCondition.model_validate({"detector": "leak", "resource": "rss", "limit_bytes": 64 * GiB})
MB = 1_000_000


def rss_history(minutes: float, slope_per_minute: float, seed: int, sigma: float = 60 * MB, base: float = 40 * GiB):
    n = noise(seed, sigma)
    return healthy(minutes * 60, rss_bytes=lambda t: int(base + slope_per_minute * t / 60 + n(t)))


def test_theil_sen_ignores_outliers_that_would_swing_least_squares():
    points = [(float(x), 2.0 * x) for x in range(50)]
    points[10] = (10.0, 10_000.0)
    points[40] = (40.0, -10_000.0)
    slope, intercept, rising = theil_sen(points)
    assert abs(slope - 2.0) < 1e-9 and abs(intercept) < 1e-9
    assert rising > 0.9


@pytest.mark.parametrize("seed", range(10))
def test_20_mb_per_minute_leak_is_found_within_10_minutes_of_data(seed):
    # 44 GiB used of a 64 GiB limit, growing 20 MB/min under 60 MB of sample noise.
    history = rss_history(minutes=10, slope_per_minute=20 * MB, seed=seed, base=44 * GiB)
    snap = fleet(600, [replica(history=history)])
    finding = detect_leak(RSS, snap.replicas[0], snap, at(600))
    assert finding is not None
    slope = finding.figure("slope_bytes_per_minute")
    assert 15 * MB < slope < 25 * MB
    assert finding.figure("seconds_to_limit") < timedelta(days=1).total_seconds()


def test_less_than_the_minimum_window_is_never_judged():
    history = rss_history(minutes=8, slope_per_minute=200 * MB, seed=1)
    snap = fleet(480, [replica(history=history)])
    assert detect_leak(RSS, snap.replicas[0], snap, at(480)) is None


def test_no_false_positive_over_a_day_of_noisy_flat_memory():
    # 24 h of flat RSS with 60 MB gaussian noise and allocator steps that come and go, judged every 5 minutes.
    n = noise(42, 60 * MB)
    history = healthy(24 * 3600, interval=30,
                      rss_bytes=lambda t: int(30 * GiB + n(t) + (512 * MiB if (t // 1800) % 2 else 0)))
    rep = replica(history=history)
    snap = fleet(24 * 3600, [rep])
    fired = [t for t in range(600, 24 * 3600 + 1, 300) if detect_leak(RSS, rep, snap, at(t)) is not None]
    assert fired == []


def test_slow_leak_that_never_reaches_the_limit_within_the_horizon_is_quiet():
    history = rss_history(minutes=30, slope_per_minute=5 * MB, seed=3, base=10 * GiB)
    snap = fleet(1800, [replica(history=history)])
    cond = RSS.model_copy(update={"limit_bytes": 512 * GiB})
    assert detect_leak(cond, snap.replicas[0], snap, at(1800)) is None


def test_limit_defaults_to_host_memory_for_rss_and_gpu_memory_for_vram():
    history = healthy(1200, gpu_memory_bytes=lambda t: int(120 * GiB + 50 * MB * t / 60))
    rep = replica(history=history)
    from tests.policy.series import gpu

    snap = fleet(1200, [rep], gpus=[gpu(0, memory_total_bytes=141 * GiB)])
    vram = LeakCondition.model_validate({"detector": "leak", "resource": "gpu_memory"})
    finding = detect_leak(vram, rep, snap, at(1200))
    assert finding is not None and finding.measured["limit_bytes"] == 141 * GiB
