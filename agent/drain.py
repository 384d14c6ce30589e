"""When a drain is done: the load balancer's grace, then the engine's in-flight count at zero twice in a row.

Readiness goes off as the replica enters DRAINING, so the load balancer stops sending before the SIGTERM
(docs/design.md: SIGTERM aborts in-flight requests unless --shutdown-timeout > 0). The load balancer polls
/ready, so new requests may still arrive during ``drain_grace``; a wake-up for another wish does not shorten
it. Then the engine's running plus waiting requests are polled until they read zero twice in a row: a request
the API server is still tokenizing is in neither gauge yet, and a SIGTERM then would answer it 500 (seen with
real vLLM under load). ``drain_timeout`` bounds the whole drain, grace included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from agent.phases import Outcome

DRAIN_QUIET_POLLS = 2  # consecutive polls with nothing running or waiting before the drain is done
DrainEnd = Literal["drained", "deadline", "exit"]
# A supervisor's phase (``ReplicaSupervisor._phase``): its work, the engine's exit or a wake-up, first.
Phase = Callable[[Awaitable[Any] | None, float | None], Awaitable[tuple[Outcome, Any]]]


async def drain(phase: Phase, busy: Callable[[], Awaitable[float | None]], mono: Callable[[], float], *,
                grace: float, within: float, poll_interval: float) -> DrainEnd:
    """Wait out the grace, then for ``busy()`` (requests running plus waiting) to read 0 twice in a row, all
    ``within`` seconds: "drained", "deadline" (the time ran out first) or "exit" (the engine exited meanwhile)."""
    deadline = mono() + within
    grace_end = mono() + min(grace, within)
    while (left := grace_end - mono()) > 0:
        outcome, _ = await phase(asyncio.sleep(left), None)
        if outcome == "exit":
            return "exit"
    quiet = 0
    while mono() < deadline:
        outcome, running = await phase(busy(), max(0.0, deadline - mono()))
        if outcome == "exit":
            return "exit"
        quiet = quiet + 1 if outcome == "done" and running == 0 else 0
        if quiet >= DRAIN_QUIET_POLLS:
            break
        await phase(asyncio.sleep(poll_interval), None)
    return "drained" if mono() < deadline else "deadline"
