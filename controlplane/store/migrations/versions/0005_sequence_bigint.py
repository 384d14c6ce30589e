"""A node's report sequence is 64-bit: any sequence the wire accepts must fit its column.

On PostgreSQL the column was a 32-bit integer, so a report with a sequence past 2^31 - 1 (an agent's counter
is far from it; a broken or hostile one need not be) failed with a 500 instead of being stored.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.alter_column("last_sequence", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.alter_column("last_sequence", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False)
