"""Engines by name: which engine each replica runs (``engines/``: vllm, sglang).

``replicas.engine_kind`` is what the agent reported; existing rows, and agents that predate engine names,
read as vLLM, the engine every replica ran before. Downgrading drops the column: every replica then reads as
vLLM again, which is wrong only for SGLang replicas, and their next report is refused by no one (the field is
dropped with the column's reader).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("engine_kind", sa.String(16), nullable=False, server_default="vllm"))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("engine_kind")
