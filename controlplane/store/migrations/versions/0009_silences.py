"""Silences: operators' matchers that keep alerts from being notified over a window.

``silences`` holds each silence as created (its matchers in Alertmanager's text, the window, who and why) and
when and by whom it was expired by hand; expired rows are kept. Nothing else changes: whether an alert is
silenced or inhibited is judged at read time, so downgrading only drops the table (and the silences with it).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", sa.DateTime(), nullable=False),
        sa.Column("ends_at", sa.DateTime(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expired_at", sa.DateTime(), nullable=True),
        sa.Column("expired_by", sa.String(128), nullable=True),
    )
    op.create_index("ix_silences_ends_at", "silences", ["ends_at"])


def downgrade() -> None:
    op.drop_index("ix_silences_ends_at", table_name="silences")
    op.drop_table("silences")
