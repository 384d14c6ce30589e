"""Samples packed one row per node per instant: ``samples`` (a JSON row per replica or GPU) becomes
``node_samples`` (docs/design.md, "The store").

Every stored point is kept: the rows of one node at one time and resolution become one packed row, raw points
and one-minute buckets alike. The old rows are streamed; the packed ones are held until the read ends (a
fraction of the old table's size) and written in batches. Downgrading unpacks them again into one row per
subject.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op

# Packed as this revision stored them (format 1); 0013 is where rows in format 2 begin.
from controlplane.store.packing import pack_format_1, unpack

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_BATCH = 5_000
_metadata = sa.MetaData()
_old = sa.Table(
    "samples", _metadata,
    sa.Column("id", sa.Integer, primary_key=True), sa.Column("node", sa.String(64)),
    sa.Column("subject_kind", sa.String(16)), sa.Column("subject", sa.String(64)), sa.Column("at", sa.DateTime),
    sa.Column("resolution_seconds", sa.Integer), sa.Column("values", sa.JSON))
_new = sa.Table(
    "node_samples", _metadata,
    sa.Column("id", sa.Integer, primary_key=True), sa.Column("node", sa.String(64)), sa.Column("at", sa.DateTime),
    sa.Column("resolution_seconds", sa.Integer), sa.Column("data", sa.LargeBinary))


def _create_new() -> None:
    op.create_table(
        "node_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("resolution_seconds", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_node_samples_node_at", "node_samples", ["node", "at"])
    op.create_index("ix_node_samples_at", "node_samples", ["at"])


def _create_old() -> None:
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("subject_kind", sa.String(length=16), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("resolution_seconds", sa.Integer(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_samples_subject_at", "samples", ["node", "subject_kind", "subject", "at"])


def _grouped(conn: sa.Connection) -> Iterator[dict[str, Any]]:
    """The old rows as packed rows, one per (node, time, resolution), streamed in that order."""
    query = sa.select(_old.c.node, _old.c.at, _old.c.resolution_seconds, _old.c.subject_kind, _old.c.subject,
                      _old.c["values"]).order_by(_old.c.node, _old.c.at, _old.c.resolution_seconds, _old.c.id
                                                 ).execution_options(yield_per=_BATCH)
    key: tuple[Any, ...] | None = None
    items: list[tuple[str, str, dict[str, Any]]] = []
    for node, at, width, kind, subject, values in conn.execute(query):
        if key is not None and (node, at, width) != key:
            yield {"node": key[0], "at": key[1], "resolution_seconds": key[2], "data": pack_format_1(items)}
            items = []
        key = (node, at, width)
        items.append((kind, subject, dict(values or {})))
    if key is not None and items:
        yield {"node": key[0], "at": key[1], "resolution_seconds": key[2], "data": pack_format_1(items)}


def _in_batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def upgrade() -> None:
    _create_new()
    conn = op.get_bind()
    # Read to the end before writing: not every driver lets one connection insert while it streams a query.
    rows = list(_grouped(conn))
    for batch in _in_batches(iter(rows)):
        conn.execute(_new.insert(), batch)
    op.drop_index("ix_samples_subject_at", table_name="samples")
    op.drop_table("samples")


def downgrade() -> None:
    _create_old()
    conn = op.get_bind()
    query = sa.select(_new.c.node, _new.c.at, _new.c.resolution_seconds, _new.c.data).order_by(_new.c.id)
    unpacked = [{"node": node, "subject_kind": kind, "subject": subject, "at": at, "resolution_seconds": width,
                 "values": values}
                for node, at, width, data in conn.execute(query) for kind, subject, values in unpack(data)]
    for batch in _in_batches(iter(unpacked)):
        conn.execute(_old.insert(), batch)
    op.drop_index("ix_node_samples_at", table_name="node_samples")
    op.drop_index("ix_node_samples_node_at", table_name="node_samples")
    op.drop_table("node_samples")
