"""Which shards of the policy rounds this control plane holds (docs/design.md, "Spreading rounds").

With ``policy_shards: 1`` (the default) the leader's rounds judge the whole fleet, as they always did. With more,
on PostgreSQL, every control plane's rounds hold a fair share of the ``policy_shards`` model shards and the one
node shard, each shard a session advisory lock on a connection of their own:

- Each holder also holds a shared membership lock, so every holder can list the members (``pg_locks``) and
  knows its fair share: the shards divided evenly by the members, the first ones by backend pid taking one more
  where they do not divide (each member works out the same split).
- Each tick (before a round) a holder over its share hands the extra shards back; one under it tries the free
  ones. A new instance gets its share within a tick of the others; a dead one's locks go with its session, and the
  others take its shards on their next tick.
- Two holders never judge the same replica: a shard's lock is one session's at a time. What they decide meets
  under the guardrails' lock (``hold_guardrails``), which keeps the rate limit and the breaker fleet-wide and
  makes a decision recorded by one visible to the next.

SQLite has one writer on one host: there the leader holds every shard.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Protocol

from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from controlplane.leader import lock_engine, unlock_all
from controlplane.policy.shards import Part

log = logging.getLogger(__name__)
# Two-key advisory locks (a space of their own beside the one-key leader, migration and guardrail locks).
SHARD_LOCK_CLASS = 0x7069_7368  # "pish": (class, shard index)
MEMBER_LOCK_CLASS = 0x7069_736D  # "pism": (class, 0), shared by every instance that takes shards


class ShardLeases(Protocol):
    def tick(self, leader: bool) -> Part | None:
        """Take or hand back shards; the part held now (None: nothing, this control plane only follows)."""
        ...

    def release(self) -> None: ...


class LeaderHoldsAll:
    """The leader holds every shard (one shard, or SQLite)."""

    def __init__(self, count: int = 1) -> None:
        self._whole = Part.whole(count)

    def tick(self, leader: bool) -> Part | None:
        return self._whole if leader else None

    def release(self) -> None:
        pass


class AdvisoryShardLeases:
    """A fair share of ``count + 1`` shards, each held as ``pg_advisory_lock(SHARD_LOCK_CLASS, index)``."""

    def __init__(self, url: str, count: int) -> None:
        self._engine = lock_engine(url)
        self._count = count
        self._conn: Connection | None = None
        self._pid = 0  # the backend of ``_conn``: where this member stands in the split
        self._held: set[int] = set()
        self._mutex = threading.Lock()
        self._released = False  # the control plane stops: no shard is taken again

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._held)

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                self._conn.close()
        self._conn = None
        self._held.clear()

    def _share(self, conn: Connection, total: int) -> int:
        """This member's share: the shards split evenly over the members, the first ones by backend pid taking
        one more where they do not divide (every member computes the same split)."""
        me = self._pid
        members = sorted(int(pid) for pid in conn.execute(text(
            "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = :class AND objid = 0 AND objsubid = 2"), {"class": MEMBER_LOCK_CLASS}).scalars())
        if me not in members:
            members = sorted([*members, me])
        each, rest = divmod(total, len(members))
        return each + (1 if members.index(me) < rest else 0)

    def tick(self, leader: bool) -> Part | None:
        with self._mutex:
            if self._released:
                return None
            before = set(self._held)
            try:
                self._balance()
            except SQLAlchemyError as exc:
                self._drop()
                log.warning("policy shards: database unreachable (%s); holding none", type(exc).__name__)
            if self._held != before:
                held = Part.of(self._count, self._held)
                log.warning("policy shards: this control plane now judges %s", held.describe())
            return Part.of(self._count, self._held) if self._held else None

    def _balance(self) -> None:
        if self._conn is None:
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._pid = int(self._conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            self._conn.execute(text("SELECT pg_advisory_lock_shared(:class, 0)"), {"class": MEMBER_LOCK_CLASS})
        conn = self._conn
        total = self._count + 1
        share = self._share(conn, total)
        for index in sorted(self._held, reverse=True)[:max(0, len(self._held) - share)]:
            conn.execute(text("SELECT pg_advisory_unlock(:class, :index)"),
                         {"class": SHARD_LOCK_CLASS, "index": index})
            self._held.discard(index)
        for index in range(total):
            if len(self._held) >= share:
                break
            if index in self._held:
                continue
            got = conn.execute(text("SELECT pg_try_advisory_lock(:class, :index)"),
                               {"class": SHARD_LOCK_CLASS, "index": index}).scalar()
            if got:
                self._held.add(index)

    def release(self) -> None:
        with self._mutex:
            self._released = True
            unlock_all(self._conn)
            self._drop()
            self._engine.dispose()


def shard_leases_for(url: str, count: int) -> ShardLeases:
    if count > 1 and url.startswith("postgresql"):
        return AdvisoryShardLeases(url, count)
    return LeaderHoldsAll(count)
