"""Samples packed in format 2 (docs/design.md, "The store"): whole numbers as integers of the bytes they need,
the other floats' bytes stored by significance, a preset dictionary in the head's new shape.

Upgrading rewrites no row: rows in format 1 stay readable and age out through retention, and rows are written in
format 2 from this revision on. The revision is what keeps a build that cannot read format 2 from starting on a
store that holds it (it does not know the revision). Downgrading repacks the format 2 rows into format 1, so the
builds before this revision read every row, a page of rows at a time.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlplane.store.packing import FORMAT, PackError, pack_format_1, unpack

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_PAGE = 2_000
_rows = sa.Table("node_samples", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                 sa.Column("data", sa.LargeBinary))


def upgrade() -> None:
    pass


def downgrade() -> None:
    conn = op.get_bind()
    update = _rows.update().where(_rows.c.id == sa.bindparam("row")).values(data=sa.bindparam("packed"))
    after = 0
    while True:
        page = conn.execute(sa.select(_rows.c.id, _rows.c.data).where(_rows.c.id > after)
                            .order_by(_rows.c.id).limit(_PAGE)).all()
        if not page:
            return
        repacked = []
        for row_id, data in page:
            if bytes(data[:1]) != bytes([FORMAT]):
                continue
            try:
                repacked.append({"row": row_id, "packed": pack_format_1(unpack(bytes(data)))})
            except PackError:  # unreadable in any format: left as it is, skipped by every reader
                continue
        if repacked:
            conn.execute(update, repacked)
        after = page[-1][0]
