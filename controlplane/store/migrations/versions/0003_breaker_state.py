"""The remediation circuit breaker's state: one row, so a trip survives a control-plane restart.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "breaker_state",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("tripped_at", sa.DateTime(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("reset_at", sa.DateTime(), nullable=True),
        sa.Column("reset_by", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("breaker_state")
