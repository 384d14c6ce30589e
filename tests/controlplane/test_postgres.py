"""The same store on PostgreSQL (Debian's server, started with pg_ctl in a temp dir): migrate, report, read."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.cli import main
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import body, replica, report


@pytest.mark.slow
def test_postgres_store_round_trip(postgres_url: str, clock) -> None:
    assert main(["migrate", "--database-url", postgres_url]) == 0
    config = ServerConfig(database_url=postgres_url)
    with TestClient(create_app(config, clock=clock)) as client:
        answer = client.post("/v1/agents/gpu-a/report", json=body(report(replicas=[replica("r0"), replica("r1")])))
        assert answer.status_code == 200
        assert client.post("/v1/agents/gpu-a/report", json=body(report())).status_code == 200  # duplicate
        assert [r["name"] for r in client.get("/v1/replicas").json()] == ["r0", "r1"]
        assert client.get("/v1/nodes/gpu-a").json()["reports_total"] == 1
        assert client.get("/readyz").status_code == 200
        assert len(client.get("/v1/replicas/gpu-a/r0/samples").json()) == 1
        assert client.delete("/v1/nodes/gpu-a").status_code == 204  # GPUs and replicas cascade
        assert client.get("/v1/replicas").json() == [] and client.get("/v1/gpus").json() == []
