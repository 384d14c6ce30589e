"""The live cap, judged: whether a replica's engine took the cap asked of it, and whether it can take one.

The cap is written to the replica's desired state with no new generation (``fleet.desired``); the agent writes it
to the engine's cap file and reports what its plug-in says back (``agent.wire.LiveLimits``): ``asked``, what the
agent wrote, is the convergence signal. The engine takes the file at its next scheduler step, so an idle engine
shows the new cap in effect (``cap``) only once a request comes; waiting for that would hold an action on an
engine nobody sends to. Pure: the caller passes the replica as reported. docs/design.md, "Live cap".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError

from agent.wire import LiveLimits, ReplicaState

Progress = Literal["done", "pending", "fatal"]
# Before the engine's plug-in has written its state there is nothing to judge yet.
_STARTING = frozenset({ReplicaState.STARTING, ReplicaState.WARMING, ReplicaState.STOPPED, ReplicaState.BACKOFF,
                       ReplicaState.STOPPING, ReplicaState.DRAINING})


def reported(live_limits: Mapping[str, Any] | None) -> LiveLimits | None:
    """A stored report of the plug-in (``Replica.live_limits``) as the agent's model; None when absent or not
    readable as one."""
    if live_limits is None:
        return None
    try:
        return LiveLimits.model_validate(dict(live_limits))
    except ValidationError:
        return None


def takes(limits: LiveLimits | None, cap: int | None = None) -> bool:
    """Whether an engine whose plug-in reported ``limits`` changes its running limit live: the plug-in active with
    its startup limit known, and ``cap`` (when given) within that limit."""
    return (limits is not None and limits.active and limits.startup_limit is not None
            and (cap is None or cap <= limits.startup_limit))


def asked_limit(limits: LiveLimits | None) -> int | None:
    """The most requests an engine is asked to run at once through its active plug-in: the cap asked, never above
    the startup limit, or the startup limit with no cap; None when it does not take a live cap."""
    if limits is None or not takes(limits):
        return None
    assert limits.startup_limit is not None
    return limits.startup_limit if limits.asked is None else min(limits.asked, limits.startup_limit)


def cap_words(cap: int | None) -> str:
    """A cap as outcomes say it."""
    return "no live cap" if cap is None else f"live cap {cap}"


def unavailable(key: str, limits: LiveLimits | None) -> str | None:
    """Why ``key`` cannot take a live cap now, or None when its plug-in is active."""
    if limits is None:
        return (f"{key} runs without live limits (live_limits: true in its agent's replica config starts the "
                "engine with the live-cap plug-in); a --max-num-seqs change restarts it")
    if not limits.active:
        return f"the live cap is not active on {key}: {limits.reason or 'its plug-in said no reason'}"
    return None


def above_startup(key: str, limits: LiveLimits, cap: int | None) -> str | None:
    """Why ``cap`` is more than ``key``'s engine can run (its startup ``--max-num-seqs``), or None."""
    if cap is not None and limits.startup_limit is not None and cap > limits.startup_limit:
        return (f"a live cap of {cap} is above {key}'s startup --max-num-seqs {limits.startup_limit}: the cap "
                "only holds requests back; more slots need a restart (set_max_num_seqs)")
    return None


def cap_progress(key: str, state: str | None, limits: LiveLimits | None,
                 cap: int | None) -> tuple[Progress, str | None]:
    """Where one replica stands against the cap asked of it, and why it failed: done once the agent reports
    having written ``cap`` (the engine takes it at its next step); fatal when the plug-in is off or refused."""
    if state is None:
        return "pending", None  # not reported (yet)
    if limits is None and state in _STARTING:
        return "pending", None  # its engine starting: the plug-in writes its state when the scheduler is built
    if state == ReplicaState.FATAL:
        return "fatal", f"{key} is FATAL"
    problem = unavailable(key, limits)
    if problem is not None:
        return "fatal", problem
    assert limits is not None
    return ("done" if limits.asked == cap else "pending"), None
