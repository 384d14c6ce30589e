from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane import pg
from tests.controlplane.fixtures import FakeClock
from tests.helpers import serve_in_thread


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def postgres_address() -> Iterator[str]:
    """One throw-away PostgreSQL server for the whole session (each test gets its own database)."""
    reason = pg.missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with pg.postgres_server() as address:
        yield address


@pytest.fixture
def postgres_url(postgres_address: str) -> Iterator[str]:
    with pg.fresh_database(postgres_address) as url:
        yield url


# The store and API tests run on both backends: SQLite (the default) and PostgreSQL.
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return f"sqlite:///{tmp_path / 'pitstop.db'}"


@pytest.fixture
def config(db_url: str) -> ServerConfig:
    return ServerConfig(database_url=db_url, stale_after_seconds=30)


@pytest.fixture
def app(config: ServerConfig, clock: FakeClock) -> FastAPI:
    return create_app(config, clock=clock)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[str]:
    """A real control plane (viewer token "look", agent token "agent") served by uvicorn in a thread."""
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", viewer_tokens=["look"],
                          agent_tokens=["agent"])
    with serve_in_thread(create_app(config)) as url:
        yield url
