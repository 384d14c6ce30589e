"""What every request handler needs, built once per app by ``create_app`` and kept on ``app.state``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fastapi import Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from controlplane.api.auth import TokenCheck
from controlplane.api.telemetry import Telemetry
from controlplane.config import ServerConfig

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
    agent_auth: TokenCheck
    read_auth: TokenCheck
    operator_auth: TokenCheck

    @property
    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.config.stale_after_seconds)


def get_context(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.pitstop
    return ctx


def get_session(request: Request) -> Iterator[Session]:
    """One session per request, committed when the handler returns normally."""
    session = get_context(request).sessions()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def require_reader(request: Request) -> None:
    get_context(request).read_auth.require(request)
