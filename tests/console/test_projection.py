"""The replica page's memory projection: the leak detector's own fit, drawn and said toward the limit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controlplane.console import projection, replica_view
from controlplane.policy.conditions import LeakCondition
from controlplane.policy.detectors.leak import detect_leak
from controlplane.policy.snapshot import Node
from tests.policy.series import at, fleet, healthy, noise, replica

GiB, MiB = 2**30, 2**20
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def samples(minutes: float, rss: Callable[[float], float], every: float = 10.0) -> list[dict[str, Any]]:
    """Readings as ``GET …/samples`` answers them, every ``every`` seconds; ``rss``: bytes at t seconds."""
    return [{"at": (T0 + timedelta(seconds=t)).isoformat(), "resolution_seconds": 0,
             "values": {"rss_bytes": int(rss(t)), "gpu_memory_bytes": 70 * GiB}}
            for t in (i * every for i in range(int(minutes * 60 / every) + 1))]


def test_the_page_fits_what_the_leak_detector_fits() -> None:
    # 44 GiB of a 64 GiB host, climbing 20 MiB a minute under 60 MiB of noise: the detector's own test case.
    n = noise(3, 60 * MiB)
    history = healthy(600, rss_bytes=lambda t: int(44 * GiB + 20 * MiB * t / 60 + n(t)))
    snap = fleet(600, [replica(history=history)], nodes=[Node(name="n1", memory_total_bytes=64 * GiB)])
    finding = detect_leak(LeakCondition.model_validate({"detector": "leak", "resource": "rss"}),
                          snap.replicas[0], snap, at(600))
    assert finding is not None
    shown = [{"at": s.at.isoformat(), "values": {"rss_bytes": s.rss_bytes}} for s in history]
    trend = projection.fit(shown, "rss_bytes", 64 * GiB)
    assert trend.slope * 60 == pytest.approx(finding.figure("slope_bytes_per_minute"))
    assert trend.level == pytest.approx(finding.figure("trend_bytes"))
    # The detector fires at 95 % of the limit; the page projects to the limit itself.
    assert trend.seconds_to_limit == pytest.approx(
        finding.figure("seconds_to_limit") + 0.05 * 64 * GiB / trend.slope)


def test_a_steady_climb_is_projected_to_the_hosts_memory() -> None:
    # 60 GiB and 1 GiB more an hour, with one allocator step that a least-squares fit would chase.
    shown = samples(60, lambda t: 60 * GiB + GiB * t / 3600 + (2 * GiB if t == 1800 else 0))
    trend = projection.fit(shown, "rss_bytes", 64 * GiB)
    assert trend.growing and trend.slope * 3600 == pytest.approx(GiB, rel=1e-6)
    assert trend.seconds_to_limit == pytest.approx(3 * 3600, rel=1e-6)
    assert projection.caption(trend, "RSS", "the host's") == "RSS grows 1.0 GiB/h; reaches the host's 64 GiB in 3 h"
    # Three hours away and an hour of readings: the line goes as far ahead as the readings reach back.
    start, end = projection.line(trend)
    assert start["at"] == T0 + timedelta(hours=1) and start["value"] == pytest.approx(61 * 1024)
    assert end["at"] == T0 + timedelta(hours=2) and end["value"] == pytest.approx(62 * 1024)


def test_the_line_stops_at_the_limit_when_it_is_nearer_than_the_horizon() -> None:
    shown = samples(60, lambda t: 63 * GiB + 1.5 * GiB * t / 3600)  # 64.5 GiB by the last reading
    trend = projection.fit(shown, "rss_bytes", 65 * GiB)
    assert trend.seconds_to_limit == pytest.approx(1200, rel=1e-6)
    _, end = projection.line(trend)
    assert abs(end["at"] - (T0 + timedelta(minutes=80))) < timedelta(seconds=1)
    assert end["value"] == pytest.approx(65 * 1024)
    assert projection.caption(trend, "RSS", "the host's").endswith("reaches the host's 65 GiB in 20 min")
    over = projection.fit(shown, "rss_bytes", 64 * GiB)
    assert over.seconds_to_limit == 0 and projection.caption(over, "RSS", "the host's").endswith(
        "at the host's 64 GiB already")


def test_a_slow_leak_is_said_in_mib_an_hour() -> None:
    trend = projection.fit(samples(60, lambda t: 40 * GiB + 42 * MiB * t / 3600), "rss_bytes", 64 * GiB)
    assert projection.caption(trend, "RSS", "the host's") == "RSS grows 42 MiB/h; reaches the host's 64 GiB in 24 d 8 h"


def test_flat_noisy_memory_is_no_growth_and_draws_no_line() -> None:
    n = noise(7, 50 * MiB)
    trend = projection.fit(samples(60, lambda t: 20 * GiB + n(t)), "rss_bytes", 64 * GiB)
    assert not trend.growing and trend.seconds_to_limit is None and projection.line(trend) == []
    assert projection.caption(trend, "RSS", "the host's") == "RSS: no growth in this window; the limit is the " \
                                                            "host's 64 GiB"
    flat = projection.fit(samples(60, lambda t: 20 * GiB), "gpu_memory_bytes", None)
    assert flat.slope == 0 and projection.caption(flat, "GPU memory", "the GPU's") == \
        "GPU memory: no growth in this window"


def test_too_few_readings_are_not_fitted() -> None:
    trend = projection.fit(samples(0.5, lambda t: GiB * (1 + t)), "rss_bytes", 64 * GiB)
    assert trend.readings == 4 and not trend.growing and projection.line(trend) == []
    assert projection.caption(trend, "RSS", "the host's") == (
        "RSS: too few readings in this window for a trend (4 over 30 s; the fit needs 20 over 10 min)")
    assert projection.fit([], "rss_bytes", None).readings == 0


def test_growth_with_no_known_limit_is_drawn_to_the_horizon() -> None:
    trend = projection.fit(samples(30, lambda t: 10 * GiB + 512 * MiB * t / 3600), "rss_bytes", None)
    assert trend.growing and trend.seconds_to_limit is None
    _, end = projection.line(trend)
    assert end["at"] == T0 + timedelta(hours=1)
    assert projection.caption(trend, "RSS", "the host's") == "RSS grows 512 MiB/h; no limit known to project it to"


def test_the_memory_charts_carry_their_limits_projections_and_captions() -> None:
    shown = samples(60, lambda t: 60 * GiB + GiB * t / 3600)
    *_, rss, gpu = replica_view.replica_charts(shown, host_memory=64 * GiB,
                                               gpus=[{"memory_total_bytes": 141 * GiB}])
    assert rss.title == "RSS of the engine's processes (MiB), against the host's 64 GiB"
    assert rss.limit == 64 * 1024 and rss.limit_label == "the host's 64 GiB" and len(rss.projection) == 2
    assert rss.note == "RSS grows 1.0 GiB/h; reaches the host's 64 GiB in 3 h"
    assert gpu.title == "GPU memory of the engine's processes (MiB), against the GPU's 141 GiB"
    assert gpu.limit == 141 * 1024 and gpu.projection == [] and gpu.note.startswith("GPU memory: no growth")
    # Two GPUs' memory together; one that does not report its total leaves no limit (too low a sum would alarm).
    *_, gpu = replica_view.replica_charts(shown, gpus=[{"memory_total_bytes": 141 * GiB}] * 2)
    assert gpu.title.endswith("against its 2 GPUs' 282 GiB")
    *_, rss, gpu = replica_view.replica_charts(shown, gpus=[{"memory_total_bytes": 141 * GiB}, None])
    assert gpu.limit is None and gpu.title.endswith("; its 2 GPUs' memory total is not reported")
    assert rss.limit is None and rss.title.endswith("; the host's memory total is not reported")
    assert rss.note == "RSS grows 1.0 GiB/h; no limit known to project it to" and len(rss.projection) == 2


@pytest.mark.parametrize(("seconds", "text"), [(40, "40 s"), (720, "12 min"), (3600, "1 h"), (12_000, "3 h 20 min"),
                                               (86_400 * 2 + 5 * 3600 + 59, "2 d 5 h"), (86_400, "1 d")])
def test_times_to_the_limit_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert projection.duration_text(seconds) == text


def test_rates_read_per_hour() -> None:
    assert projection.rate_text(42 * MiB / 3600) == "42 MiB/h"
    assert projection.rate_text(2.5 * MiB / 3600) == "2.5 MiB/h"
    assert projection.rate_text(3 * GiB / 3600) == "3.0 GiB/h"
