"""Migrations build an empty database; a restarted control plane keeps the fleet; silent nodes go stale."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import inspect

from controlplane.api.app import create_app
from controlplane.cli import main
from controlplane.config import ServerConfig
from controlplane.store.db import current_revision, head_revision, make_engine
from tests.controlplane.fixtures import body, report


def test_migrate_command_builds_an_empty_database(tmp_path: Path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'cp.db'}"
    assert main(["migrate", "--database-url", url]) == 0
    assert f"revision {head_revision()}" in capsys.readouterr().out
    engine = make_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert {"nodes", "gpus", "replicas", "replica_events", "node_samples", "desired_replicas"} <= tables
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
    assert main(["migrate", "--database-url", url]) == 0  # a second run is a no-op, not an error
    with sqlite3.connect(tmp_path / "new" / "cp.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # A node's packed row is about 1.4 KB: 4 KB pages would leave a third of the samples table unused.
        assert raw.execute("PRAGMA page_size").fetchone()[0] == 16384
    engine = make_engine(url)
    try:
        with engine.connect() as conn:  # the log copied back at 4 MiB, as with SQLite's default pages
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 256
    finally:
        engine.dispose()


def test_a_store_made_with_small_pages_keeps_them_and_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as raw:  # as an earlier build created it
        raw.execute("PRAGMA page_size=4096")
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("CREATE TABLE kept (v INTEGER)")
        raw.execute("INSERT INTO kept VALUES (7)")
        raw.commit()
    assert main(["migrate", "--database-url", f"sqlite:///{path}"]) == 0
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1024
    finally:
        engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert raw.execute("SELECT v FROM kept").fetchall() == [(7,)]
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_migrate_reports_a_bad_config_file(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "server.yaml"
    bad.write_text("stale_after_seconds: -1\n")
    assert main(["migrate", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "stale_after_seconds" in err


def test_restart_on_the_same_file_keeps_everything(config: ServerConfig, clock) -> None:
    with TestClient(create_app(config, clock=clock)) as first:
        first.post("/v1/agents/gpu-a/report", json=body(report()))
        before = {p: first.get(p).json() for p in ("/v1/nodes", "/v1/replicas", "/v1/gpus", "/v1/events")}
    with TestClient(create_app(config, clock=clock)) as second:
        after = {p: second.get(p).json() for p in ("/v1/nodes", "/v1/replicas", "/v1/gpus", "/v1/events")}
        # The next report is still judged against the sequence stored before the restart.
        second.post("/v1/agents/gpu-a/report", json=body(report(sequence=1)))
        assert second.get("/v1/nodes/gpu-a").json()["reports_total"] == 1
    assert after == before and before["/v1/replicas"]


def test_silent_node_reads_stale_then_recovers(client: TestClient, clock) -> None:
    client.post("/v1/agents/gpu-a/report", json=body(report(sequence=1)))
    clock.advance(29)
    assert client.get("/v1/nodes").json()[0]["status"] == "up"
    clock.advance(2)
    node = client.get("/v1/nodes").json()[0]
    assert node["status"] == "stale" and node["last_report_age_seconds"] == 31
    assert client.get("/v1/replicas").json()[0]["node_status"] == "stale"
    assert 'pitstop_cp_nodes{status="stale"} 1.0' in client.get("/metrics").text
    client.post("/v1/agents/gpu-a/report", json=body(report(sequence=2, sent_at=clock.now)))
    assert client.get("/v1/nodes").json()[0]["status"] == "up"
    assert 'pitstop_cp_nodes{status="up"} 1.0' in client.get("/metrics").text


def test_health_ready_and_request_latency(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok"}
    client.get("/v1/nodes/whoever")
    text = client.get("/metrics").text
    # Routes are labelled by template, so node names never become label values.
    assert 'route="/v1/nodes/{node}",status="404"' in text and "whoever" not in text


def test_readyz_fails_when_the_database_is_gone(tmp_path: Path, clock) -> None:
    db = tmp_path / "gone" / "cp.db"
    config = ServerConfig(database_url=f"sqlite:///{db}")
    app = create_app(config, clock=clock)
    with TestClient(app) as c:
        # The control plane's own jobs keep using the database meanwhile and may open (so create) a file in the
        # directory between two deletions: remove it until it is gone, after which nothing can be created in it.
        for _ in range(100):
            with contextlib.suppress(OSError):
                shutil.rmtree(db.parent)
            if not db.parent.exists():
                break
        assert not db.parent.exists()
        app.state.pitstop.engine.dispose()  # drop pooled connections that still hold the unlinked file
        assert c.get("/readyz").status_code == 503
