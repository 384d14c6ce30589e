"""The replica state machine: every allowed transition works, every other one is refused, each makes an event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import product
from pathlib import Path

import pytest

from agent.event_journal import EventJournal
from agent.states import ALLOWED, ReplicaMachine, TransitionError, can_transition
from agent.wire import ReplicaState

PAIRS = list(product(ReplicaState, ReplicaState))
ALLOWED_PAIRS = [(a, b) for a, b in PAIRS if b in ALLOWED[a]]
REFUSED_PAIRS = [(a, b) for a, b in PAIRS if b not in ALLOWED[a]]


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def test_every_state_has_a_row() -> None:
    assert set(ALLOWED) == set(ReplicaState)


@pytest.mark.parametrize(("src", "dst"), ALLOWED_PAIRS, ids=lambda s: s.value)
def test_allowed_transition_moves_and_records_one_event(src: ReplicaState, dst: ReplicaState) -> None:
    clock = FakeClock()
    machine = ReplicaMachine("r1", src, clock)
    event = machine.to(dst, "because")
    assert machine.state == dst
    assert machine.since == event.at
    assert (event.from_state, event.to_state, event.kind, event.message) == (src, dst, "transition", "because")
    assert machine.drain_events() == [event]
    assert machine.drain_events() == []


@pytest.mark.parametrize(("src", "dst"), REFUSED_PAIRS, ids=lambda s: s.value)
def test_refused_transition_raises_and_changes_nothing(src: ReplicaState, dst: ReplicaState) -> None:
    machine = ReplicaMachine("r1", src, FakeClock())
    with pytest.raises(TransitionError):
        machine.to(dst)
    assert machine.state == src
    assert machine.pending_events == 0
    assert not can_transition(src, dst)


def test_the_happy_path_and_a_crash_loop_are_allowed() -> None:
    S = ReplicaState
    path = [S.STARTING, S.WARMING, S.READY, S.DRAINING, S.STOPPING, S.STOPPED, S.STARTING, S.BACKOFF, S.STARTING,
            S.WARMING, S.BACKOFF, S.FATAL, S.STARTING]
    machine = ReplicaMachine("r1", S.STOPPED, FakeClock())
    for state in path:
        machine.to(state)
    assert [e.to_state for e in machine.drain_events()] == path


def test_event_buffer_is_bounded_and_requeue_keeps_order() -> None:
    machine = ReplicaMachine("r1", ReplicaState.ATTACHED, FakeClock(), max_events=3)
    for _ in range(5):
        machine.to(ReplicaState.UNREACHABLE if machine.state == ReplicaState.ATTACHED else ReplicaState.ATTACHED)
    events = machine.drain_events()
    assert len(events) == 3  # the oldest two were dropped
    later = machine.note("crash", "exit 0")
    machine.requeue(events[1:])
    assert machine.drain_events() == [*events[1:], later]


def test_events_not_yet_delivered_outlive_the_agent(tmp_path: Path) -> None:
    S = ReplicaState
    journal = tmp_path / "run" / "r1.events"
    clock = FakeClock()
    first = ReplicaMachine("r1", S.READY, clock, journal=EventJournal(journal))
    delivered = first.to(S.DRAINING)
    assert first.drain_events() == [delivered]  # in a report whose answer is not back yet
    stopping = first.to(S.STOPPING)
    # Killed here: the next agent starts with what it cannot know was delivered, then what was not sent.
    second = ReplicaMachine("r1", S.STOPPED, clock, journal=EventJournal(journal))
    assert second.drain_events() == [delivered, stopping]
    second.requeue([delivered, stopping])  # that report failed
    assert ReplicaMachine("r1", S.STOPPED, clock, journal=EventJournal(journal)).drain_events() == [
        delivered, stopping]
    assert second.drain_events() == [delivered, stopping]
    assert second.drain_events() == []  # the previous report was delivered: nothing left to send again
    assert not journal.exists()
    journal.write_text('{"replica": "r1", "at": "2026-01-0')  # a line cut short by a kill is skipped
    assert ReplicaMachine("r1", S.STOPPED, clock, journal=EventJournal(journal)).drain_events() == []
