"""Shared ticks: periodic work of many tasks woken together instead of each on its own.

Much of an idle agent's CPU is its wakeups, not the work done in them: on a quiet 16-core host, waking from a
20 ms sleep cost 0.16 ms of CPU, as much as parsing a whole vLLM /metrics body (bench/README.md). Timers that
round up to the same multiple of their period on the loop's clock fire in one pass of the event loop: the
collector and every engine's log check at the default intervals, and the canaries of one round that gather the
rest of their answers.
"""

from __future__ import annotations

import math


def until_tick(now: float, every: float) -> float:
    """Seconds from ``now`` to the next multiple of ``every`` (both on one clock, the loop's); a whole ``every``
    when ``now`` is on a tick. ``every`` <= 0: no wait."""
    if every <= 0:
        return 0.0
    return (math.floor(now / every) + 1) * every - now
