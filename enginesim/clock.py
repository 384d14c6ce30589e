"""Clocks the engine runs on: the real monotonic clock, or a virtual one that benchmarks and tests fast-forward."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds and a way to wait for them to pass."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall time: ``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class VirtualClock:
    """Time that jumps forward when the engine sleeps.

    Only the engine loop may sleep on it. Before jumping it yields to the event loop a few times, so clients
    reading the tokens of the step just finished see the instant they were delivered (and submit their next
    request then).
    """

    def __init__(self, start: float = 0.0, yields_per_sleep: int = 4) -> None:
        self._now = start
        self._yields = yields_per_sleep

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        for _ in range(self._yields):
            await asyncio.sleep(0)
        self._now += max(0.0, seconds)
