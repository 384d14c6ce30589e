"""The notifier: alerts that resolve, notification groups, and an outbox that renders at send time.

``alerts`` gain the policy that raised them, when its condition last held and why they resolved.
``notification_groups`` keep what each receiver was last told about each alert group.
``notification_deliveries`` become the outbox of grouped notifications: the group, why it was sent, what to
say (no secrets: the receiver's format renders it when sending) and the alerts it carries. Deliveries queued
before the notifier existed name no receiver that is configured and can never be sent: they are marked
failed, saying so; their alerts are notified by their groups from now on.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

BEFORE = "queued before the notifier existed; the alert is notified by its group"


def upgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("policy", sa.String(64), nullable=True))
        batch.add_column(sa.Column("last_seen_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("resolved_reason", sa.Text(), nullable=False, server_default=""))
    op.create_table(
        "notification_groups",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("receiver", sa.String(128), nullable=False),
        sa.Column("group_key", sa.String(512), nullable=False),
        sa.Column("group_labels", sa.JSON(), nullable=False),
        sa.Column("last_sent_at", sa.DateTime(), nullable=True),
        sa.Column("told", sa.JSON(), nullable=False),
        sa.UniqueConstraint("receiver", "group_key"),
    )
    with op.batch_alter_table("notification_deliveries") as batch:
        batch.alter_column("alert_id", existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column("group_key", sa.String(512), nullable=True))
        batch.add_column(sa.Column("reason", sa.String(16), nullable=False, server_default=""))
        batch.add_column(sa.Column("notification", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("alert_ids", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("sent_at", sa.DateTime(), nullable=True))
    deliveries = sa.table("notification_deliveries", sa.column("status", sa.String()), sa.column("error", sa.Text()),
                          sa.column("next_retry_at", sa.DateTime()))
    op.execute(deliveries.update().where(deliveries.c.status == "pending")
               .values(status="failed", error=BEFORE, next_retry_at=None))
    # The policy behind each alert, from the action that raised it.
    op.execute(sa.text("UPDATE alerts SET policy = (SELECT actions.policy FROM actions WHERE actions.id = "
                       "alerts.action_id)"))


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM notification_deliveries WHERE alert_id IS NULL"))
    with op.batch_alter_table("notification_deliveries") as batch:
        for column in ("sent_at", "alert_ids", "notification", "reason", "group_key"):
            batch.drop_column(column)
        batch.alter_column("alert_id", existing_type=sa.Integer(), nullable=False)
    op.drop_table("notification_groups")
    with op.batch_alter_table("alerts") as batch:
        for column in ("resolved_reason", "last_seen_at", "policy"):
            batch.drop_column(column)
