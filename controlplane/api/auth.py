"""Who is calling: bearer tokens from the configuration (bootstrap) and from the database, each with a role.

With no token anywhere (configuration and database) the API stays open, as a loopback convenience, and the app
says so loudly at start; the moment any token exists every endpoint but probes and /metrics needs one.
Token lookups are cached for ``cache_seconds``, so a revocation by another process takes effect within that.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastapi import HTTPException, status
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ServerConfig
from controlplane.security import tokens
from controlplane.security.roles import ANONYMOUS, Principal, Role, role_allows
from controlplane.store.db import session_scope
from controlplane.store.models import ApiToken

# last_used_at is written at most this often per token: a report every 5 s must not become a write every 5 s.
LAST_USED_RESOLUTION = timedelta(seconds=60)


class AuthError(HTTPException):
    """401 (no usable credentials) or 403 (credentials that may not do this)."""

    def __init__(self, code: int, detail: str) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if code == status.HTTP_401_UNAUTHORIZED else None
        super().__init__(code, detail, headers=headers)


@dataclass
class _Cached:
    row: ApiToken
    fetched: float


def _config_principals(config: ServerConfig) -> list[tuple[bytes, Principal]]:
    out: list[tuple[bytes, Principal]] = []
    for field, role in (("admin_tokens", Role.ADMIN), ("operator_tokens", Role.OPERATOR),
                        ("viewer_tokens", Role.VIEWER), ("agent_tokens", Role.AGENT),
                        ("alertmanager_tokens", Role.ALERTMANAGER)):
        for i, secret in enumerate(getattr(config, field)):
            out.append((secret.get_secret_value().encode(), Principal(name=f"config:{role.value}-{i}", role=role)))
    return out


class Authenticator:
    """Turns an ``Authorization`` header into a ``Principal`` allowed to do what is asked, or raises."""

    def __init__(self, config: ServerConfig, sessions: sessionmaker[Session], *, clock: Callable[[], datetime],
                 monotonic: Callable[[], float] = time.monotonic, cache_seconds: float = 5.0) -> None:
        self._configured = _config_principals(config)
        self._sessions = sessions
        self._clock = clock
        self._monotonic = monotonic
        self._ttl = cache_seconds
        self._rows: dict[int, _Cached] = {}
        self._open_checked: tuple[float, bool] | None = None

    def open_mode(self) -> bool:
        """True while no token exists at all (configuration or database)."""
        if self._configured:
            return False
        now = self._monotonic()
        if self._open_checked is None or now - self._open_checked[0] > self._ttl:
            with session_scope(self._sessions) as session:
                is_open = tokens.count_usable(session=session, now=self._clock()) == 0
            self._open_checked = (now, is_open)
        return self._open_checked[1]

    def invalidate(self) -> None:
        """Forget cached lookups (after this process created, revoked or rotated a token)."""
        self._rows.clear()
        self._open_checked = None

    def _from_config(self, given: bytes) -> Principal | None:
        # Compare with every configured token, always, in constant time: timing reveals neither which matched.
        found: Principal | None = None
        for secret, principal in self._configured:
            if hmac.compare_digest(given, secret) and found is None:
                found = principal
        return found

    def _row(self, token_id: int) -> ApiToken | None:
        cached = self._rows.get(token_id)
        if cached is not None and self._monotonic() - cached.fetched <= self._ttl:
            return cached.row
        with session_scope(self._sessions) as session:
            row = session.get(ApiToken, token_id)
            if row is not None:
                session.expunge(row)
        if row is not None:
            self._rows[token_id] = _Cached(row, self._monotonic())
        return row

    def _touch(self, row: ApiToken, now: datetime) -> None:
        if row.last_used_at is not None and now - row.last_used_at < LAST_USED_RESOLUTION:
            return
        row.last_used_at = now
        with session_scope(self._sessions) as session:
            stored = session.get(ApiToken, row.id)
            if stored is not None:
                stored.last_used_at = now

    def _from_database(self, token: str) -> Principal | None:
        token_id = tokens.parse_token_id(token)
        if token_id is None:
            return None
        row = self._row(token_id)
        now = self._clock()
        if row is None or not tokens.matches(row, token) or not tokens.usable(row, now):
            return None
        self._touch(row, now)
        return Principal(name=row.name, role=Role(row.role), node=row.node, token_id=row.id)

    def identify(self, header: str | None) -> Principal:
        """The caller, or AuthError(401) for a missing token and AuthError(403) for an unknown one."""
        if self.open_mode():
            return ANONYMOUS
        scheme, _, token = (header or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError(status.HTTP_401_UNAUTHORIZED, "token required (Authorization: Bearer ...)")
        principal = self._from_config(token.encode()) or self._from_database(token)
        if principal is None:
            raise AuthError(status.HTTP_403_FORBIDDEN, "token not accepted")
        return principal

    def require(self, header: str | None, needed: Role, *, node: str | None = None) -> Principal:
        principal = self.identify(header)
        if principal.anonymous:
            return principal
        if not role_allows(principal.role, needed):
            article = "an" if needed.value[0] in "aeiou" else "a"
            raise AuthError(status.HTTP_403_FORBIDDEN, f"{article} {needed.value} token is needed "
                                                       f"(this one is {principal.role.value})")
        if node is not None and not principal.may_report_as(node):
            raise AuthError(status.HTTP_403_FORBIDDEN, f"this agent token may only report as node "
                                                       f"{principal.node!r}")
        return principal
