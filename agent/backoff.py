"""Crash-loop policy as data: the delay before restart attempt n, and when to give up (FATAL).

GPUStack restarts a failed instance after 10·2ⁿ s capped at 300 s; supervisord gives up after
``startretries``. We count failures inside a sliding window so a replica that crashed once a week never
reaches FATAL, while one that crashes on every start does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def backoff_delay(attempt: int, base: float = 10.0, cap: float = 300.0) -> float:
    """Seconds to wait before restart ``attempt`` (0-based): ``base·2ⁿ`` capped at ``cap``."""
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    # Clamp the exponent so huge attempt counts cannot overflow a float.
    return float(min(cap, base * (2 ** min(attempt, 62))))


@dataclass
class FailureWindow:
    """Failure times of one replica; decides BACKOFF (with its delay) or FATAL. Pure: ``now`` is passed in."""

    max_failures: int = 5
    window: float = 600.0
    base: float = 10.0
    cap: float = 300.0
    _times: deque[float] = field(default_factory=deque)

    def record(self, now: float) -> float | None:
        """Record a failure at ``now``; return the delay before the next attempt, or ``None`` for FATAL."""
        self._times.append(now)
        while self._times and now - self._times[0] > self.window:
            self._times.popleft()
        if len(self._times) >= self.max_failures:
            return None
        return backoff_delay(len(self._times) - 1, self.base, self.cap)

    def reset(self) -> None:
        """Forget past failures (an operator restart out of FATAL starts afresh)."""
        self._times.clear()

    @property
    def recent(self) -> int:
        return len(self._times)
