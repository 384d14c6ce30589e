"""Initial fleet tables: nodes, gpus, replicas, replica events, samples and desired replica specs.

Revision ID: 0001
Create Date: 2026-11-29 16:01:18.828739
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "desired_replicas",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("engine_args", sa.JSON(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "name"),
    )
    with op.batch_alter_table("desired_replicas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_desired_replicas_node"), ["node"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("hostname", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=64), nullable=False),
        sa.Column("agent_url", sa.String(length=512), nullable=True),
        sa.Column("first_seen_at", sa.DateTime(), nullable=False),
        sa.Column("last_report_at", sa.DateTime(), nullable=False),
        sa.Column("last_sent_at", sa.DateTime(), nullable=False),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.Column("reports_total", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "replica_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("replica", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("replica_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_replica_events_at"), ["at"], unique=False)
        batch_op.create_index("ix_replica_events_node_replica_at", ["node", "replica", "at"], unique=False)

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
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.create_index("ix_samples_subject_at", ["node", "subject_kind", "subject", "at"], unique=False)

    op.create_table(
        "gpus",
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("readings", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["node"], ["nodes.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node", "index"),
    )
    op.create_table(
        "replicas",
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("managed", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("engine_args", sa.JSON(), nullable=False),
        sa.Column("restarts_total", sa.Integer(), nullable=False),
        sa.Column("state_since", sa.DateTime(), nullable=False),
        sa.Column("last_exit_code", sa.Integer(), nullable=True),
        sa.Column("log_tail", sa.JSON(), nullable=False),
        sa.Column("engine", sa.JSON(), nullable=True),
        sa.Column("process", sa.JSON(), nullable=True),
        sa.Column("canary_ttft_seconds", sa.Double(), nullable=True),
        sa.Column("canary_ok", sa.Boolean(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["node"], ["nodes.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node", "name"),
    )


def downgrade() -> None:
    op.drop_table("replicas")
    op.drop_table("gpus")
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_index("ix_samples_subject_at")

    op.drop_table("samples")
    with op.batch_alter_table("replica_events", schema=None) as batch_op:
        batch_op.drop_index("ix_replica_events_node_replica_at")
        batch_op.drop_index(batch_op.f("ix_replica_events_at"))

    op.drop_table("replica_events")
    op.drop_table("nodes")
    with op.batch_alter_table("desired_replicas", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_desired_replicas_node"))

    op.drop_table("desired_replicas")
