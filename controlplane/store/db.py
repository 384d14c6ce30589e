"""Engines, sessions and migrations for one database URL (no module-level engine: each app builds its own)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# Several control planes may start together on one PostgreSQL; this lock lets one migrate while the others wait.
MIGRATION_LOCK_ID = 0x7069_7473
# Agents report concurrently; writers wait this long for SQLite's single write lock instead of failing.
SQLITE_BUSY_TIMEOUT_MS = 5000
# A node's packed row is 1.2 to 1.5 KB (docs/design.md, "The store") and a page holds whole rows: in SQLite's
# default 4 KB pages a row a little over a third of a page leaves a third of each page unused (format 1 rows of
# 8 replicas and 8 GPUs did); 16 KB pages leave about one row's worth, a twelfth or less. SQLite takes a page
# size only before the file's first table (and not once it is in WAL mode), so a store created with 4 KB pages
# keeps them.
SQLITE_PAGE_SIZE = 16384
# The write-ahead log is copied back into the database by the commit that finds it this long (SQLite counts it in
# pages). 4 MiB is SQLite's default with 4 KB pages; counted in pages, 16 KB pages would make each of these
# copies four times longer, and the report whose commit runs it waits that long.
SQLITE_CHECKPOINT_BYTES = 4 << 20


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # a no-op on a file that already has tables
    # WAL lets the console's reads run while a report is being written.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    page_size = cursor.execute("PRAGMA page_size").fetchone()[0]
    cursor.execute(f"PRAGMA wal_autocheckpoint={max(1, SQLITE_CHECKPOINT_BYTES // page_size)}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for ``url``; for a SQLite file, creates its folder and switches it to WAL mode."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # As many connections as request threads (Starlette's threadpool holds 40): under a burst of reports a
    # smaller pool made threads wait for a connection until they timed out with a 500.
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=30, pool_timeout=10)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the database to ``revision`` with Alembic (idempotent: an up-to-date database is left alone)."""
    _alembic(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Take the database back to ``revision`` (what an older Pitstop expects), migrations' downgrades in turn."""
    _alembic(engine, command.downgrade, revision)


def _alembic(engine: Engine, step: Callable[[AlembicConfig, str], None], revision: str) -> None:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":  # one migrating process at a time
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        cfg.attributes["connection"] = connection
        step(cfg, revision)


def head_revision() -> str:
    """The newest migration shipped with this version of Pitstop."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, "the migrations directory has no head"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        try:
            row = connection.execute(text("SELECT version_num FROM alembic_version")).first()
        except Exception:
            return None
    return None if row is None else str(row[0])


def ping(engine: Engine) -> None:
    """Raise if the database cannot answer a trivial query."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
