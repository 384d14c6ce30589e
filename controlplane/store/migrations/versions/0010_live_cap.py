"""Live cap: the cap on running requests asked of a replica's engine, and its plug-in as reported.

``desired_replicas.live_cap`` is what the agent is told to write to the engine's cap file (no generation: it
needs no restart); ``replicas.live_limits`` is the agent's report of the plug-in (active, the cap in effect, the
startup limit, what it last wrote). Both nullable, so existing rows mean "no cap" and "not reported";
downgrading drops the columns and with them every cap asked (engines keep their startup limits).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("desired_replicas") as batch:
        batch.add_column(sa.Column("live_cap", sa.Integer(), nullable=True))
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("live_limits", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("live_limits")
    with op.batch_alter_table("desired_replicas") as batch:
        batch.drop_column("live_cap")
