"""Memory's trend on the replica page, projected to the limit it would exhaust. Pure.

The fit is the leak detector's own (``policy.detectors.leak.theil_sen``, on seconds and bytes): the dashed line
and the caption say what that fit reads in the window shown, so a slow climb can be seen before the detector's
gates let a policy act on it. The limit is the detector's too: the host's memory for RSS, the replica's GPUs'
memory together for GPU memory. The gates that tell growth from noise are the detector's defaults (enough
readings over a long enough span, most pairwise slopes rising); its minimum slope is not one of them, as a climb
too slow for a policy is still worth reading here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from controlplane.console.shaping import GIB, MIB, Json, _parse_time
from controlplane.policy.conditions import LeakCondition
from controlplane.policy.detectors.leak import theil_sen

_LEAK = LeakCondition.model_fields
MIN_SAMPLES: int = _LEAK["min_samples"].default
MIN_WINDOW_SECONDS: float = _LEAK["min_window"].default
# Flat noise sits near one half of the pairwise slopes rising.
MIN_RISING_FRACTION: float = _LEAK["min_rising_fraction"].default


@dataclass(frozen=True)
class Trend:
    """One memory series' fitted trend: ``slope`` in bytes per second, ``level`` the trend's bytes at the last
    reading ``last_at``; ``seconds_to_limit`` None when it does not grow or no limit is known; ``span`` the
    seconds the readings cover."""

    readings: int
    span: float
    slope: float = 0.0
    rising: float = 0.0
    level: float = 0.0
    last_at: datetime | None = None
    limit: int | None = None
    seconds_to_limit: float | None = None

    @property
    def enough(self) -> bool:
        return self.readings >= MIN_SAMPLES and self.span >= MIN_WINDOW_SECONDS

    @property
    def growing(self) -> bool:
        return self.enough and self.slope > 0 and self.rising >= MIN_RISING_FRACTION


def fit(samples: Sequence[Json], field: str, limit: int | None) -> Trend:
    """The trend of ``field`` (``rss_bytes``, ``gpu_memory_bytes``) over ``samples`` and, when it grows, the
    seconds until its level reaches ``limit`` (0 when already there)."""
    readings: list[tuple[datetime, float]] = []
    for s in samples:
        value, at = (s.get("values") or {}).get(field), _parse_time(s.get("at"))
        if value is not None and at is not None:
            readings.append((at, float(value)))
    readings.sort()
    if len(readings) < 2:
        return Trend(readings=len(readings), span=0.0, limit=limit)
    t0, last_at = readings[0][0], readings[-1][0]
    points = [((at - t0).total_seconds(), value) for at, value in readings]
    slope, intercept, rising = theil_sen(points)
    level = intercept + slope * points[-1][0]  # the trend's level at the last reading, not that one reading
    trend = Trend(readings=len(points), span=points[-1][0], slope=slope, rising=rising, level=level,
                  last_at=last_at, limit=limit)
    if not trend.growing or limit is None:
        return trend
    return replace(trend, seconds_to_limit=max(0.0, (limit - level) / slope))


def line(trend: Trend, scale: float = 1 / MIB) -> list[dict[str, Any]]:
    """The dashed projection (points at, value, in ``scale`` units): from the trend's level at the last reading to
    the limit, or as far ahead as the readings reach back, whichever is nearer (a trend fitted over ten minutes
    says little of next week). Empty when memory does not grow."""
    if not trend.growing or trend.last_at is None:
        return []
    ahead = trend.span if trend.seconds_to_limit is None else min(trend.seconds_to_limit, trend.span)
    end = trend.last_at + timedelta(seconds=ahead)
    return [{"at": trend.last_at, "value": round(trend.level * scale, 3)},
            {"at": end, "value": round((trend.level + trend.slope * ahead) * scale, 3)}]


def gib_text(size: float) -> str:
    return f"{round(size / GIB, 1):g} GiB"


def rate_text(bytes_per_second: float) -> str:
    """A growth rate per hour, in MiB below a GiB an hour."""
    per_hour = bytes_per_second * 3600 / MIB
    if per_hour >= 1024:
        return f"{per_hour / 1024:.1f} GiB/h"
    return f"{per_hour:.1f} MiB/h" if per_hour < 10 else f"{per_hour:.0f} MiB/h"


def duration_text(seconds: float) -> str:
    """A time to the limit as a person says it: 40 s, 12 min, 3 h 20 min, 2 d 5 h."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)} s"
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h" + (f" {rest} min" if rest else "")
    days, hours = divmod(hours, 24)
    return f"{days} d" + (f" {hours} h" if hours else "")


def caption(trend: Trend, what: str, owner: str) -> str:
    """One line under the chart: "RSS grows 42 MiB/h; reaches the host's 64 GiB in 3 h 20 min", or why there is
    no projection. ``owner``: whose memory the limit is ("the host's", "the GPU's")."""
    limit = None if trend.limit is None else f"{owner} {gib_text(trend.limit)}"
    if not trend.enough:
        return (f"{what}: too few readings in this window for a trend ({trend.readings} over "
                f"{duration_text(trend.span)}; the fit needs {MIN_SAMPLES} over {duration_text(MIN_WINDOW_SECONDS)})")
    if not trend.growing:
        return f"{what}: no growth in this window" + (f"; the limit is {limit}" if limit else "")
    grows = f"{what} grows {rate_text(trend.slope)}"
    if limit is None or trend.seconds_to_limit is None:
        return f"{grows}; no limit known to project it to"
    if trend.seconds_to_limit == 0:
        return f"{grows}; at {limit} already"
    return f"{grows}; reaches {limit} in {duration_text(trend.seconds_to_limit)}"
