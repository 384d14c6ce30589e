"""Quantiles over a window from cumulative histogram buckets, the way PromQL's ``histogram_quantile`` does.

Lifetime quantiles hide a regression behind hours of good history, so the agent subtracts the previous
scrape's buckets from the current ones and estimates quantiles over that delta only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

Buckets = Mapping[float, float]  # upper bound (le, +Inf included) -> cumulative count


def bucket_delta(current: Buckets, previous: Buckets | None) -> dict[float, float]:
    """``current - previous`` per bucket; a drop anywhere means the engine restarted, so the window is
    ``current`` alone (what was observed since the restart), never negative counts."""
    if previous is None:
        return dict(current)
    delta = {le: count - previous.get(le, 0.0) for le, count in current.items()}
    if any(v < 0 for v in delta.values()):
        return dict(current)
    return delta


def quantile(q: float, buckets: Buckets) -> float | None:
    """Estimate the ``q`` quantile (0..1) from cumulative buckets; ``None`` when nothing was observed.

    Linear interpolation inside the bucket that holds the rank; a rank in the ``+Inf`` bucket returns the
    highest finite bound (as Prometheus does), since nothing better is known.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must be within [0, 1]")
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank and count > lower_count:
            if math.isinf(le):
                return lower_bound
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = (le if not math.isinf(le) else lower_bound), count
    return lower_bound
