"""Migrations: from an empty database to head, and from the previous revision with data in it."""

from __future__ import annotations

from sqlalchemy import inspect, text

from controlplane.store.db import current_revision, head_revision, make_engine, migrate

NEW_TABLES = {"actions", "audit_log", "alerts", "notification_deliveries", "api_tokens"}


def test_up_from_empty(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine)
        assert current_revision(engine) == head_revision()
        assert set(inspect(engine).get_table_names()) >= NEW_TABLES
        migrate(engine)  # idempotent
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_up_from_the_previous_revision_keeps_the_fleet(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "0001")
        assert current_revision(engine) == "0001"
        assert not NEW_TABLES & set(inspect(engine).get_table_names())
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO nodes (name, hostname, agent_version, first_seen_at, last_report_at, last_sent_at, "
                "last_sequence, reports_total, status, cordoned) VALUES ('gpu-a', 'h', '0.1', "
                "'2026-11-29 12:00:00', '2026-11-29 12:00:00', '2026-11-29 12:00:00', 7, 7, 'up', false)"))
        migrate(engine)
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name, last_sequence FROM nodes")).all() == [("gpu-a", 7)]
            assert conn.execute(text("SELECT count(*) FROM actions")).scalar() == 0
    finally:
        engine.dispose()
