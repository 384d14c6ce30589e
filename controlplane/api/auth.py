"""Who is calling: bearer tokens from the configuration (bootstrap) and from the database, each with a role.

With no token anywhere (configuration and database) the API stays open, as a loopback convenience, and the app
says so loudly at start; the moment any token exists every endpoint but probes and /metrics needs one.
Token lookups are cached for ``cache_seconds``, so a revocation by another process takes effect within that.

On behalf of a person: a static token configured with ``on_behalf_of: true`` (the console's service token behind
a reverse proxy that authenticates people) may send ``X-Pitstop-On-Behalf-Of: <person>``. The request then acts
as that person, at the lower of the token's role and the person's (``people`` in the settings), and the audit
log names both. Any other token sending the header is refused (403), never served as itself: a client that
believes it acts for someone must not have its writes recorded under another name. Database tokens cannot
delegate; the permission lives only in the server's own settings.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastapi import HTTPException, status
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ConfigError, ConfiguredToken, ServerConfig
from controlplane.security import tokens
from controlplane.security.roles import (
    ANONYMOUS,
    ON_BEHALF_OF_HEADER,
    PERSON_ROLES,
    Principal,
    Role,
    lower_role,
    person_name_problem,
    role_allows,
)
from controlplane.store.db import session_scope
from controlplane.store.models import ApiToken

# last_used_at is written at most this often per token: a report every 5 s must not become a write every 5 s.
LAST_USED_RESOLUTION = timedelta(seconds=60)


class AuthError(HTTPException):
    """401 (no usable credentials), 403 (credentials that may not do this), 400 (a person's name that is not)."""

    def __init__(self, code: int, detail: str) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if code == status.HTTP_401_UNAUTHORIZED else None
        super().__init__(code, detail, headers=headers)


@dataclass
class _Cached:
    row: ApiToken
    fetched: float


def _config_principals(config: ServerConfig, env: Mapping[str, str]) -> list[tuple[bytes, Principal]]:
    out: list[tuple[bytes, Principal]] = []
    for field, role in (("admin_tokens", Role.ADMIN), ("operator_tokens", Role.OPERATOR),
                        ("viewer_tokens", Role.VIEWER), ("agent_tokens", Role.AGENT),
                        ("alertmanager_tokens", Role.ALERTMANAGER)):
        for i, entry in enumerate(getattr(config, field)):
            name = f"config:{role.value}-{i}"
            if isinstance(entry, ConfiguredToken):
                try:
                    secret = entry.secret(env)
                except ConfigError as exc:
                    raise ConfigError(f"{field}[{i}]: {exc}") from exc
                # Typed to person roles, but checked here too: an agent never acts for anyone.
                delegates = entry.on_behalf_of and role in PERSON_ROLES
                out.append((secret.encode(), Principal(name=name, role=role, on_behalf_of=delegates)))
            else:
                out.append((entry.get_secret_value().encode(), Principal(name=name, role=role)))
    return out


class Authenticator:
    """Turns an ``Authorization`` header into a ``Principal`` allowed to do what is asked, or raises."""

    def __init__(self, config: ServerConfig, sessions: sessionmaker[Session], *, clock: Callable[[], datetime],
                 monotonic: Callable[[], float] = time.monotonic, cache_seconds: float = 5.0,
                 env: Mapping[str, str] | None = None) -> None:
        """``env`` holds the variables ``token_env`` entries name (the process's environment by default);
        ConfigError when one is unset, so the server refuses to start rather than run without that token."""
        self._configured = _config_principals(config, os.environ if env is None else env)
        self._people = config.people
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

    def identify(self, header: str | None, on_behalf_of: Sequence[str] = ()) -> Principal:
        """The caller, or AuthError(401) for a missing token and AuthError(403) for an unknown one.

        With ``on_behalf_of`` (the ``X-Pitstop-On-Behalf-Of`` header's values) the caller is that person, when
        the token may act for people; 403 when it may not, 400 for a value that is not one person's name.
        """
        if self.open_mode():
            if on_behalf_of:
                raise AuthError(status.HTTP_403_FORBIDDEN, f"the control plane is open (no token exists): nobody "
                                                           f"acts on behalf of anyone; drop {ON_BEHALF_OF_HEADER}")
            return ANONYMOUS
        scheme, _, token = (header or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError(status.HTTP_401_UNAUTHORIZED, "token required (Authorization: Bearer ...)")
        principal = self._from_config(token.encode()) or self._from_database(token)
        if principal is None:
            raise AuthError(status.HTTP_403_FORBIDDEN, "token not accepted")
        return self._for_person(principal, on_behalf_of) if on_behalf_of else principal

    def _for_person(self, token: Principal, header: Sequence[str]) -> Principal:
        """The person the header names, acting through ``token`` at no more than either's role."""
        if not token.on_behalf_of or token.role not in PERSON_ROLES:
            raise AuthError(status.HTTP_403_FORBIDDEN, f"this token may not act on behalf of anyone: "
                                                       f"{ON_BEHALF_OF_HEADER} needs a token configured with "
                                                       f"on_behalf_of: true")
        if len(header) != 1:
            raise AuthError(status.HTTP_400_BAD_REQUEST, f"{ON_BEHALF_OF_HEADER} given {len(header)} times: "
                                                         "name one person")
        person = header[0]
        problem = person_name_problem(person)
        if problem is not None:
            raise AuthError(status.HTTP_400_BAD_REQUEST, f"{ON_BEHALF_OF_HEADER} {problem}")
        role = lower_role(token.role, self._people.role_of(person))
        return Principal(name=person, role=role, token_id=token.token_id, via=token.name)

    def require(self, header: str | None, needed: Role, *, node: str | None = None,
                on_behalf_of: Sequence[str] = ()) -> Principal:
        principal = self.identify(header, on_behalf_of)
        if principal.anonymous:
            return principal
        if not role_allows(principal.role, needed):
            article = "an" if needed.value[0] in "aeiou" else "a"
            if principal.via is not None:
                raise AuthError(status.HTTP_403_FORBIDDEN, f"{article} {needed.value} is needed: "
                                                           f"{principal.name} acts as {principal.role.value} "
                                                           f"(through {principal.via})")
            raise AuthError(status.HTTP_403_FORBIDDEN, f"{article} {needed.value} token is needed "
                                                       f"(this one is {principal.role.value})")
        if node is not None and not principal.may_report_as(node):
            raise AuthError(status.HTTP_403_FORBIDDEN, f"this agent token may only report as node "
                                                       f"{principal.node!r}")
        return principal
