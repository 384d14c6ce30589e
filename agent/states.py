"""The replica state machine: allowed transitions, a guard before every change, one event per transition.

Who owns each arrow (all of them live in the supervisor)::

    STOPPED  -> STARTING   start requested (config, desired state, or BACKOFF expired)
                           or an engine a previous agent left, adopted (``agent.adopted``)
    STARTING -> WARMING    /health is 200 and /v1/models lists the model
    WARMING  -> READY      warmup requests answered
    READY    -> DRAINING   stop/restart requested: readiness off first (docs/design.md: SIGTERM aborts in-flight)
    READY    -> WEDGED     the agent's canaries failed ``wedge_canaries`` times in a row while no generation
                           token moved (``agent.progress``): readiness off at once, without the control plane
    WEDGED   -> STOPPING   a new generation, a stop or a cordon: no drain, a frozen engine finishes nothing
    STARTING -> DRAINING   an adopted engine that runs what is no longer wanted: its work finishes first
    DRAINING -> STOPPING   running+waiting reached 0, or the drain deadline passed
    STOPPING -> STOPPED    the process group exited (SIGKILL after the stop deadline)
    STARTING|WARMING|READY|WEDGED|DRAINING -> BACKOFF   the engine exited unasked (exit code 0 included),
                                                        or the start deadline passed
    BACKOFF  -> STARTING   the backoff delay elapsed
    BACKOFF  -> FATAL      too many failures within the window (supervisord's startretries)
    STARTING|WARMING|BACKOFF|FATAL -> STOPPING|STOPPED   operator stop while not serving
    ATTACHED <-> UNREACHABLE   attached engines: probes answer, or not
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from agent.event_journal import EventJournal
from agent.wire import ReplicaEvent, ReplicaState

S = ReplicaState

# Engine process alive (or should be); an exit in these states is a failure unless we asked for it.
RUNNING_STATES = frozenset({S.STARTING, S.WARMING, S.READY, S.WEDGED, S.DRAINING})
SERVING_STATES = frozenset({S.READY})
ATTACHED_STATES = frozenset({S.ATTACHED, S.UNREACHABLE})

ALLOWED: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.STOPPED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.WARMING, S.BACKOFF, S.STOPPING, S.STOPPED, S.DRAINING}),
    S.WARMING: frozenset({S.READY, S.BACKOFF, S.STOPPING, S.STOPPED}),
    S.READY: frozenset({S.DRAINING, S.WEDGED, S.BACKOFF}),
    # Only a restart proves progress again: no way back to READY from here (vLLM #39863).
    S.WEDGED: frozenset({S.STOPPING, S.BACKOFF}),
    S.DRAINING: frozenset({S.STOPPING, S.BACKOFF, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.BACKOFF: frozenset({S.STARTING, S.FATAL, S.STOPPED}),
    S.FATAL: frozenset({S.STOPPED, S.STARTING}),
    S.ATTACHED: frozenset({S.UNREACHABLE}),
    S.UNREACHABLE: frozenset({S.ATTACHED}),
}


class TransitionError(RuntimeError):
    """A state change the table does not allow: a bug in the supervisor, never swallowed."""


def can_transition(src: ReplicaState, dst: ReplicaState) -> bool:
    return dst in ALLOWED[src]


def utc_now() -> datetime:
    return datetime.now(UTC)


class ReplicaMachine:
    """Current state of one replica plus a bounded buffer of its events, waiting for the next report."""

    def __init__(self, replica: str, initial: ReplicaState, clock: Callable[[], datetime] = utc_now,
                 max_events: int = 200, journal: EventJournal | None = None) -> None:
        self.replica = replica
        self.clock = clock
        self.state = initial
        self.since = clock()
        self._events: deque[ReplicaEvent] = deque(maxlen=max_events)
        # Events not yet delivered, on disk too: a previous agent's go out first (``agent.event_journal``).
        self.journal = journal
        if journal is not None:
            self._events.extend(journal.load())
        self._journaled = bool(self._events)

    def to(self, dst: ReplicaState, message: str = "") -> ReplicaEvent:
        """Move to ``dst`` (guarded); record and return the transition event."""
        if not can_transition(self.state, dst):
            raise TransitionError(f"replica {self.replica}: {self.state} -> {dst} is not allowed")
        event = ReplicaEvent(replica=self.replica, at=self.clock(), kind="transition",
                             from_state=self.state, to_state=dst, message=message[:4000])
        self.state = dst
        self.since = event.at
        self._record(event)
        return event

    def note(self, kind: str, message: str) -> ReplicaEvent:
        """Record a notable thing that is not a transition (a crash's exit code, a new generation)."""
        event = ReplicaEvent(replica=self.replica, at=self.clock(), kind=kind, message=message[:4000])
        self._record(event)
        return event

    def _record(self, event: ReplicaEvent) -> None:
        self._events.append(event)
        if self.journal is not None:
            self.journal.append(event)
            self._journaled = True

    def drain_events(self) -> list[ReplicaEvent]:
        """Hand over the buffered events (they go into one report) and forget them.

        The journal then holds what this report carries (the previous one's were delivered, or were requeued
        into this one), plus whatever is recorded until the next."""
        events = list(self._events)
        self._events.clear()
        if self.journal is not None and (events or self._journaled):
            self.journal.replace(events)
            self._journaled = bool(events)
        return events

    def requeue(self, events: list[ReplicaEvent]) -> None:
        """Put back events whose report was not delivered, oldest first, within the buffer's bound."""
        pending = list(self._events)
        self._events.clear()
        for event in [*events, *pending]:
            self._events.append(event)

    @property
    def pending_events(self) -> int:
        return len(self._events)
