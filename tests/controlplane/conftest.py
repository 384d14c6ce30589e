from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import FakeClock
from tests.helpers import free_port, http_ok, wait_until


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
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
    """A real control plane (viewer token "look") served by uvicorn in a thread on a free loopback port."""
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", viewer_tokens=["look"])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/healthz"), timeout=15, what="control plane to listen")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
