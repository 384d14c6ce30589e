"""Stack dumps for restarts: ask the agent for one, then attach what it sends to the restart's action record.

The control plane never calls agents. A restart's new generation carries ``capture_stack`` (the desired row's
``capture_stack_generation`` equals its generation); the agent dumps the old engine with py-spy before it
drains it and sends the result as a ``stack_dump`` event in its next report. ``attach`` copies that event into
the restart payload's ``captured[key]`` (``stack_dump``: the text or None; ``stack_dump_note``: what happened), so the
action shows the evidence the restart destroyed (runbooks/stall.md).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.policy.payloads import PlannedRestartPayload, RestartPayload
from controlplane.policy.snapshot import split_key
from controlplane.remediation.records import write_payload
from controlplane.store.models import ActionRow, DesiredReplica, ReplicaEventRow

EVENT_KIND = "stack_dump"
PENDING = "waiting for the agent's stack dump (py-spy) of the replaced engine"
NONE_ARRIVED = ("no stack dump arrived: the agent predates stack dumps, or the engine was not running when "
                "the restart reached it")


def request(*, session: Session, node: str, name: str, generation: int) -> None:
    """Mark ``generation`` of ``node``/``name`` as one whose restart wants a dump of the engine it replaces."""
    row = session.scalars(select(DesiredReplica).where(DesiredReplica.node == node,
                                                       DesiredReplica.name == name)).one_or_none()
    if row is not None:
        row.capture_stack_generation = generation


def split_message(message: str) -> tuple[str, str | None]:
    """(note, dump) from a ``stack_dump`` event: the agent puts its note on the first line, the dump after."""
    note, _, dump = message.partition("\n")
    return note.strip(), (dump.strip() or None)


def _event_for(session: Session, key: str, since: datetime) -> ReplicaEventRow | None:
    node, name = split_key(key)
    return session.scalars(
        select(ReplicaEventRow)
        .where(ReplicaEventRow.node == node, ReplicaEventRow.replica == name, ReplicaEventRow.kind == EVENT_KIND,
               ReplicaEventRow.received_at >= since)
        .order_by(ReplicaEventRow.id).limit(1)).first()


def attach(*, session: Session, row: ActionRow, payload: RestartPayload | PlannedRestartPayload,
           final: bool = False) -> bool:
    """Copy arrived dumps into the action's captured record; ``final``: say so where none came. True if changed."""
    captured = payload.captured or {}
    if row.started_at is None or not any(c.stack_dump_note == PENDING for c in captured.values()):
        return False
    updated = dict(captured)
    for key, entry in captured.items():
        if entry.stack_dump_note != PENDING:
            continue
        # Events are matched on the control plane's receive clock: the agent's own clock may be off.
        event = _event_for(session, key, row.started_at)
        if event is not None:
            note, dump = split_message(event.message)
            updated[key] = entry.model_copy(update={"stack_dump": dump, "stack_dump_note": note})
        elif final:
            updated[key] = entry.model_copy(update={"stack_dump_note": NONE_ARRIVED})
    if updated == captured:
        return False
    write_payload(row, payload.model_copy(update={"captured": updated}))
    return True
