"""Alembic environment: runs on the connection the caller hands over (see ``controlplane.store.db.migrate``)."""

from __future__ import annotations

from alembic import context

from controlplane.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through 'pitstop server migrate', which supplies the connection")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things in place; batch mode copies the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
