"""The same store on PostgreSQL (Debian's server, started with pg_ctl in a temp dir): migrate, report, read."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from glob import glob
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.cli import main
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import free_port


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _as_postgres(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; CI containers often are root.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture
def postgres_url() -> Iterator[str]:
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL server binaries are not installed")
    workdir = Path(tempfile.mkdtemp(prefix="pitstop-pg-"))
    data, port = workdir / "data", free_port()
    try:
        if os.geteuid() == 0:
            shutil.chown(workdir, "postgres")
        subprocess.run(_as_postgres([initdb, "-D", str(data), "-U", "pitstop", "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True, timeout=120)
        options = f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-o", options, "-l", str(workdir / "pg.log"),
                                     "-w", "-t", "60", "start"]), check=True, capture_output=True, timeout=90)
        try:
            yield f"postgresql+psycopg://pitstop@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, timeout=60)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
