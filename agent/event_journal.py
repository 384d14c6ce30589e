"""A replica's events not yet delivered, kept on disk: an agent killed before its next report loses none.

The state machine holds its events in memory until a report takes them (``states.ReplicaMachine``); an agent
killed with SIGKILL (or by the OOM killer) between a transition and the next report would take them along, and
the control plane's trail of that replica would miss a step (seen: a READY -> DRAINING lost with an agent
killed the moment its replica began to drain). So each event is appended to ``<name>.events`` as it is
recorded, and each report rewrites the file to what that report carries: the file always holds every event
not yet known delivered. The next agent starts with them. An event whose report was delivered just before the
kill goes again; the control plane stores a replica's event once (``fleet.ingest``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import ValidationError

from agent.wire import ReplicaEvent

log = logging.getLogger(__name__)


class EventJournal:
    """``<name>.events``: one JSON event per line, appended as recorded, rewritten (atomically) per report."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._failing: str | None = None

    def load(self) -> list[ReplicaEvent]:
        """The events a previous agent left undelivered; a line cut short by the kill is skipped."""
        try:
            lines = self.path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return []
        events = []
        for line in lines:
            try:
                events.append(ReplicaEvent.model_validate_json(line))
            except (ValidationError, ValueError):
                continue
        return events

    def append(self, event: ReplicaEvent) -> None:
        self._guard(lambda: self._append(event))

    def replace(self, events: Iterable[ReplicaEvent]) -> None:
        """The file holds exactly ``events`` (none: it is removed)."""
        kept = list(events)
        self._guard(lambda: self._replace(kept))

    def _append(self, event: ReplicaEvent) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(event.model_dump_json() + "\n")

    def _replace(self, events: list[ReplicaEvent]) -> None:
        if not events:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(e.model_dump_json() + "\n" for e in events), encoding="utf-8")
        os.replace(tmp, self.path)

    def _guard(self, write: Callable[[], None]) -> None:
        # A full or read-only disk must not stop supervision: the events still go out from memory. Said once.
        try:
            write()
            self._failing = None
        except OSError as exc:
            if str(exc) != self._failing:
                log.warning("cannot keep undelivered events in %s: %s", self.path, exc)
            self._failing = str(exc)
