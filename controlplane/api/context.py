"""What every request handler needs, built once per app by ``create_app`` and kept on ``app.state``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from controlplane.api.auth import Authenticator
from controlplane.api.telemetry import Telemetry
from controlplane.config import ServerConfig
from controlplane.fleet.writer import ReportWriter
from controlplane.leader import Leadership
from controlplane.security.roles import ON_BEHALF_OF_HEADER, Principal, Role
from controlplane.store.db import session_scope

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class AppContext:
    config: ServerConfig
    engine: Engine
    sessions: sessionmaker[Session]
    clock: Clock
    telemetry: Telemetry
    auth: Authenticator
    leadership: Leadership
    # Writes every agent report, committing those that arrive together in one transaction.
    reports: ReportWriter

    @property
    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.config.stale_after_seconds)


def get_context(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.pitstop
    return ctx


def get_session(request: Request) -> Iterator[Session]:
    """One session per request, committed when the handler returns normally: before the answer is sent (``Db``), so
    a client that was told a write succeeded reads it back, and a commit that fails is answered as an error."""
    with session_scope(get_context(request).sessions) as session:
        yield session


def client_address(request: Request) -> str | None:
    """Where a write came from, for the audit log."""
    return None if request.client is None else f"{request.client.host}:{request.client.port}"


def _principal(request: Request, needed: Role) -> Principal:
    return get_context(request).auth.require(request.headers.get("authorization"), needed,
                                             on_behalf_of=request.headers.getlist(ON_BEHALF_OF_HEADER))


def require_reader(request: Request) -> Principal:
    return _principal(request, Role.VIEWER)


def require_operator(request: Request) -> Principal:
    return _principal(request, Role.OPERATOR)


def require_admin(request: Request) -> Principal:
    return _principal(request, Role.ADMIN)


# The parameters every router declares the same way: the app's context, a session, the caller's principal at a
# role, and a row id (a database integer: a larger number is a 422, not an overflow in the driver).
Ctx = Annotated[AppContext, Depends(get_context)]
# ``scope="function"``: by default FastAPI runs a dependency's code after ``yield`` once the response has gone out,
# and the commit with it: a write was answered before it was stored.
Db = Annotated[Session, Depends(get_session, scope="function")]
Operator = Annotated[Principal, Depends(require_operator)]
Admin = Annotated[Principal, Depends(require_admin)]
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]
