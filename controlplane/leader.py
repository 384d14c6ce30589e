"""Which control-plane process leads: a PostgreSQL session advisory lock held on a dedicated connection.

Why a lock and not a lease row: PostgreSQL releases a session lock the moment the holder's connection ends
(process killed, host gone once TCP keepalives give up), so there is no expiry to tune against clock skew and
no renewal write every few seconds. Followers try ``pg_try_advisory_lock`` every ``leader_poll_seconds``; the
leader checks its connection as often and steps down the moment that fails. Leadership only decides who runs
the scheduled jobs; safety does not rest on it: actions are claimed by a conditional state change, so even two
processes that both believed they led could not apply one action twice.

SQLite has no session locks: there the lock is an exclusive ``flock`` on a file beside the database, which the
kernel releases the moment the holder's process ends (``kill -9`` included), so a standby on the same host takes
over as on PostgreSQL. An in-memory database is one process's own: that process leads.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

log = logging.getLogger(__name__)
LEADER_LOCK_ID = 0x7069_7474  # "pitt"; the migration lock is 0x70697473


class Leadership(Protocol):
    @property
    def is_leader(self) -> bool: ...

    def tick(self) -> bool:
        """Try to become (or stay) leader; return whether this process leads now."""
        ...

    def release(self) -> None: ...


def lock_engine(url: str) -> Engine:
    """An engine for a connection that holds session advisory locks: never pooled, so closing the connection
    really ends the session, which is what releases its locks; TCP keepalives bound a silent network cut."""
    return create_engine(url, poolclass=NullPool, connect_args={
        "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
        "connect_timeout": 5})


def unlock_all(conn: Connection | None) -> None:
    """Hand back every advisory lock of ``conn``'s session before it closes. Closing alone frees them only once
    the server's backend has exited, which it does after the client has gone on: a peer's next look may still
    see them held. A broken connection has nothing to say; its backend frees them as it goes."""
    if conn is not None:
        with contextlib.suppress(SQLAlchemyError):
            conn.execute(text("SELECT pg_advisory_unlock_all()"))


class SingleProcessLeadership:
    """Always the leader (SQLite, or tests that want the jobs to run)."""

    def __init__(self) -> None:
        self._leader = False

    @property
    def is_leader(self) -> bool:
        return self._leader

    def tick(self) -> bool:
        self._leader = True
        return True

    def release(self) -> None:
        self._leader = False


class AdvisoryLockLeadership:
    """Leader while holding ``pg_advisory_lock(lock_id)`` on a connection of its own (never pooled)."""

    def __init__(self, url: str, *, lock_id: int = LEADER_LOCK_ID) -> None:
        self._engine = lock_engine(url)
        self._lock_id = lock_id
        self._conn: Connection | None = None
        self._leader = False
        self._mutex = threading.Lock()

    @property
    def is_leader(self) -> bool:
        return self._leader

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                self._conn.close()
        self._conn = None

    def tick(self) -> bool:
        with self._mutex:
            was = self._leader
            try:
                if self._conn is None:
                    self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                if self._leader:
                    self._conn.execute(text("SELECT 1"))
                else:
                    got = self._conn.execute(text("SELECT pg_try_advisory_lock(:id)"), {"id": self._lock_id})
                    self._leader = bool(got.scalar())
            except SQLAlchemyError as exc:
                self._leader = False
                self._drop()
                log.warning("leader election: database unreachable (%s); not leading", type(exc).__name__)
            if self._leader != was:
                log.warning("leader election: this control plane %s", "now leads" if self._leader else "lost the lead")
            return self._leader

    def release(self) -> None:
        with self._mutex:
            self._leader = False
            unlock_all(self._conn)
            self._drop()
            self._engine.dispose()


class FileLockLeadership:
    """Leader while holding an exclusive ``flock`` on ``path`` (SQLite: a file beside the database)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._mutex = threading.Lock()

    @property
    def is_leader(self) -> bool:
        return self._fd is not None

    def tick(self) -> bool:
        with self._mutex:
            if self._fd is not None:
                return True
            try:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                log.warning("leader election: cannot open %s (%s); not leading", self._path, exc.strerror)
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._fd = fd
            log.warning("leader election: this control plane now leads")
            return True

    def release(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)  # closing the only descriptor releases the lock
                self._fd = None


def leadership_for(url: str) -> Leadership:
    if url.startswith("postgresql"):
        return AdvisoryLockLeadership(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        database = Path(parsed.database)
        database.parent.mkdir(parents=True, exist_ok=True)
        return FileLockLeadership(database.with_name(database.name + ".leader"))
    return SingleProcessLeadership()
