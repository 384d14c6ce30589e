"""One phase of a replica's supervision: wait for its work, the engine's exit or a wake-up, whichever is first.

A wake-up is a change of what is wanted (a new desired generation, disabled, agent shutdown). When several
are done at once, the engine's exit wins, then the work, then the wake-up: an exit nobody asked for must
never be read as the work's result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Literal, TypeVar

T = TypeVar("T")
Outcome = Literal["done", "exit", "wake", "timeout"]


async def first_of(work: Awaitable[T] | None, exited: Awaitable[object] | None, wake: asyncio.Event,
                   limit: float | None) -> tuple[Outcome, T | None]:
    """(what happened first, the work's result when it was the work); ``wake`` is cleared before waiting."""
    waiters: dict[asyncio.Future[Any], Outcome] = {}
    work_task = asyncio.ensure_future(work) if work is not None else None
    if work_task is not None:
        waiters[work_task] = "done"
    if exited is not None:
        waiters[asyncio.ensure_future(exited)] = "exit"
    wake.clear()
    wake_task: asyncio.Future[Any] = asyncio.ensure_future(wake.wait())
    waiters[wake_task] = "wake"
    try:
        done, _ = await asyncio.wait(waiters, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in waiters:
            if not fut.done():
                fut.cancel()
    for outcome in ("exit", "done", "wake"):
        for fut in done:
            if waiters[fut] == outcome:
                return outcome, (fut.result() if outcome == "done" else None)
    return "timeout", None
