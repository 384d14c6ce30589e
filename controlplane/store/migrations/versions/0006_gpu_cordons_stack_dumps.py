"""GPU cordons and stack dumps: a node's set of cordoned GPUs, and the restart generation that wants a dump.

``nodes.cordoned_gpus`` lives on the node because ``gpus`` rows are replaced wholesale by every report.
``desired_replicas.capture_stack_generation`` marks the one generation whose restart asks the agent to dump
the old engine's stacks first; a later generation (set by anything else) no longer matches it.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("cordoned_gpus", sa.JSON(), nullable=True))
    with op.batch_alter_table("desired_replicas") as batch:
        batch.add_column(sa.Column("capture_stack_generation", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("desired_replicas") as batch:
        batch.drop_column("capture_stack_generation")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("cordoned_gpus")
