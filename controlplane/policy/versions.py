"""Which of a round's subjects changed since the last: a version per replica and GPU, moved when what the detectors
read of it moved (``incremental.Evaluator``; docs/design.md, "Rounds at fleet scale")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from controlplane.policy.snapshot import FleetSnapshot, Gpu, Replica


def history_span(history: Sequence[Any]) -> tuple[Any, ...]:
    # A history gains samples at its end (or, reported late, inside) and loses them at its start: its length and
    # both ends tell every change apart.
    return (len(history), history[0].at, history[-1].at) if history else (0,)


def replica_mark(replica: Replica, snapshot: FleetSnapshot) -> tuple[Any, ...]:
    """Everything a replica detector reads of one replica: its fields, its history's span, and a leak's limit
    (the host's memory, or its GPUs')."""
    node = snapshot.node(replica.node)
    return (*(v for k, v in replica.__dict__.items() if k != "history"), *history_span(replica.history),
            None if node is None else node.memory_total_bytes,
            tuple(g.memory_total_bytes for g in snapshot.gpus_of(replica)))


def gpu_mark(gpu: Gpu) -> tuple[Any, ...]:
    return (*(v for k, v in gpu.__dict__.items() if k != "history"), *history_span(gpu.history))


class Versions:
    """A version per subject, moved whenever what the detectors read of it changed since the last round.

    A subject that is the very object of the last round (a snapshot that kept an unchanged node's objects:
    ``snapshot.FleetRows``) keeps its version without its mark being worked out again; a new object is marked
    and compared. ``changed``: the keys new, gone or moved by the last ``update``."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[Any, tuple[Any, ...], int]] = {}  # key -> (object, mark, version)
        self._last = 0  # versions are never reused: a subject that left and came back is new
        self.changed: set[str] = set()
        self.order: dict[str, int] = {}  # key -> position in the subjects of the last update
        self.subjects: dict[str, Any] = {}  # key -> the subject of the last update

    def update(self, subjects: Sequence[Any], mark: Callable[[Any], tuple[Any, ...]]) -> None:
        known = self._known
        seen: dict[str, tuple[Any, tuple[Any, ...], int]] = {}
        changed = set()
        order: dict[str, int] = {}
        by_key: dict[str, Any] = {}
        for position, subject in enumerate(subjects):
            key = subject.key
            order[key] = position
            by_key[key] = subject
            last = known.get(key)
            if last is not None and last[0] is subject:
                seen[key] = last
                continue
            changed.add(key)  # a new object: unchanged only if its mark is
            now_mark = mark(subject)
            if last is None or last[1] != now_mark:
                self._last += 1
                seen[key] = (subject, now_mark, self._last)
            else:
                seen[key] = (subject, now_mark, last[2])
        changed.update(key for key in known if key not in seen)
        self._known, self.changed, self.order, self.subjects = seen, changed, order, by_key

    def __getitem__(self, key: str) -> int:
        return self._known[key][2]
