"""Writing a node's desired state: new engine args, a restart, stop/start of one replica, or its live cap.

Every change that needs the engine restarted is a new generation (docs/design.md: ``--max-num-seqs`` and every
scheduler flag are fixed at start); the agent converges on the highest generation it is told. The live cap is
the exception by design: the engine's plug-in reads it while it runs, so it changes with no new generation.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from agent.wire import ReplicaSpec
from controlplane.store.models import DesiredReplica, Node, Replica


class DesiredChange(BaseModel):
    """An operator's change to one replica. Omitted fields keep their current value."""

    engine_args: list[str] | None = Field(default=None, max_length=256)
    enabled: bool | None = None
    # True: run the same arguments again under a new generation (a scheduled restart against a slow leak).
    restart: bool = False
    # The live cap on running requests (``live_limits: true`` replicas): given, even as None (no cap), it
    # replaces the current one; left out, it stays. It needs no restart, so it makes no new generation.
    live_cap: int | None = Field(default=None, ge=1, le=65536)


class DesiredOut(ReplicaSpec):
    node: str
    updated_at: datetime


def set_desired(*, session: Session, node: str, name: str, change: DesiredChange, now: datetime) -> DesiredOut:
    """Apply ``change`` to ``node``/``name``'s desired spec, creating it from the reported replica if needed."""
    row = session.scalars(
        select(DesiredReplica).where(DesiredReplica.node == node, DesiredReplica.name == name)
    ).one_or_none()
    reported = session.get(Replica, (node, name))
    if row is None:
        row = DesiredReplica(
            node=node, name=name, enabled=True, updated_at=now,
            generation=0 if reported is None else reported.generation,
            engine_args=[] if reported is None else list(reported.engine_args),
        )
        session.add(row)
    # The new generation must beat both what we asked for before and what the agent runs now.
    current = max(row.generation, 0 if reported is None else reported.generation)
    if change.restart or change.engine_args is not None:
        row.generation = current + 1
    if change.engine_args is not None:
        row.engine_args = list(change.engine_args)
    if change.enabled is not None:
        row.enabled = change.enabled
    if "live_cap" in change.model_fields_set:
        row.live_cap = change.live_cap
    row.updated_at = now
    session.flush()
    return _out(row)


def list_desired(*, session: Session, node: str | None = None) -> list[DesiredOut]:
    query = select(DesiredReplica).order_by(DesiredReplica.node, DesiredReplica.name)
    if node is not None:
        query = query.where(DesiredReplica.node == node)
    return [_out(r) for r in session.scalars(query)]


def _out(row: DesiredReplica) -> DesiredOut:
    return DesiredOut(node=row.node, name=row.name, generation=row.generation, engine_args=list(row.engine_args),
                      enabled=row.enabled, live_cap=row.live_cap, updated_at=row.updated_at)


def forget_node(*, session: Session, node: str) -> bool:
    """Remove a decommissioned node: its latest state and desired specs go; events stay, samples age out."""
    row = session.get(Node, node)
    if row is None:
        return False
    session.execute(delete(DesiredReplica).where(DesiredReplica.node == node))
    session.delete(row)  # GPUs and replicas go with it (ON DELETE CASCADE)
    return True
