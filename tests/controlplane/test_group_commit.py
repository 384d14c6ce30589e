"""Reports written in batches (group commit) land exactly as if written one by one; a bad one fails alone."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from agent.wire import DesiredState, NodeReport, ReplicaEvent
from bench.harness.http import probe
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.fleet.desired import DesiredChange, set_desired
from controlplane.fleet.ingest import apply_reports, desired_state, desired_states
from controlplane.fleet.sequencing import Verdict
from controlplane.fleet.writer import Backlogged, ReportWriter
from controlplane.store.db import make_engine, make_sessionmaker, migrate, session_scope
from tests.controlplane import pg
from tests.controlplane.fixtures import T0, body, gpu, replica, report
from tests.helpers import free_port, http_ok, wait_until

TABLES = {
    "nodes": "name, hostname, last_sequence, last_sent_at, last_report_at, reports_total, status, cordoned",
    "gpus": "node, \"index\", uuid, updated_at, readings",
    "replicas": "node, name, state, generation, gpus, engine_args, log_tail, engine, process, state_since, ready",
    "node_samples": "node, at, resolution_seconds, data",
    "replica_events": "node, replica, at, received_at, kind, from_state, to_state, message",
}


def _dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = {t: sorted(tuple(repr(v) for v in r) for r in conn.execute(text(f"SELECT {cols} FROM {t}")))
               for t, cols in TABLES.items()}
    engine.dispose()
    return out


def _rounds() -> list[list[NodeReport]]:
    """Four arrivals of reports from four nodes: new nodes, updates, a duplicate, a late retry, a restart."""
    def rep(node: str, seq: int, second: int, replicas: int = 2) -> NodeReport:
        events = [ReplicaEvent(replica="r0", at=T0 + timedelta(seconds=second), kind="transition",
                               message=f"{node} #{seq}")]
        return report(node, sequence=seq, sent_at=T0 + timedelta(seconds=second), gpus=[gpu(0), gpu(1)],
                      replicas=[replica(f"r{k}") for k in range(replicas)], events=events)

    first = [rep("a", 1, 1), rep("b", 1, 1), rep("c", 5, 1)]
    second = [rep("a", 2, 6, replicas=1), rep("b", 1, 1), rep("c", 3, 0), rep("d", 1, 6)]
    third = [rep("a", 3, 11), rep("c", 1, 11, replicas=3), rep("d", 2, 11)]  # c restarted: counts from 1
    fourth = [rep("d", 3, 16, replicas=1)]  # a batch of one: single-row statements
    return [first, second, third, fourth]


def _fresh(tmp_path: Path, name: str) -> str:
    url = f"sqlite:///{tmp_path / name}"
    migrate(make_engine(url))
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def two_databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "sqlite":
        yield _fresh(tmp_path, "one.db"), _fresh(tmp_path, "batch.db")
        return
    address = request.getfixturevalue("postgres_address")
    with pg.fresh_database(address) as one, pg.fresh_database(address) as batch:
        migrate(make_engine(one))
        migrate(make_engine(batch))
        yield one, batch


def test_a_batch_stores_what_batches_of_one_store(two_databases: tuple[str, str]) -> None:
    one_url, batch_url = two_databases
    one, batch = make_sessionmaker(make_engine(one_url)), make_sessionmaker(make_engine(batch_url))
    for sessions in (one, batch):
        with session_scope(sessions) as session:
            set_desired(session=session, node="a", name="r0", change=DesiredChange(engine_args=["--x"]), now=T0)
    one_verdicts, batch_verdicts = [], []
    latest: dict[str, DesiredState] = {}
    for i, arrival in enumerate(_rounds()):
        now = T0 + timedelta(seconds=5 * i)
        singles = {}
        for r in arrival:
            with session_scope(one) as session:
                one_verdicts += apply_reports(session=session, reports=[r], now=now)
                singles[r.node] = desired_state(session=session, node=r.node, report_interval_seconds=5)
        with session_scope(batch) as session:
            fences: dict[str, Any] = {}  # as the report writer does: cordons read with the sequence check
            batch_verdicts += apply_reports(session=session, reports=arrival, now=now, fences=fences)
            answers = desired_states(session=session, nodes=[r.node for r in arrival], report_interval_seconds=5,
                                     fences=fences)
        assert answers == singles
        latest.update(answers)
        if i == 0:  # an operator fences node a and one of its GPUs: both answers carry it
            for url in (one_url, batch_url):
                with make_engine(url).begin() as conn:
                    conn.execute(text("UPDATE nodes SET cordoned = true, cordoned_gpus = '[1]' WHERE name = 'a'"))
    assert batch_verdicts == one_verdicts
    assert Verdict.DUPLICATE in batch_verdicts and Verdict.OUT_OF_ORDER in batch_verdicts
    assert Verdict.RESET in batch_verdicts
    assert _dump(batch_url) == _dump(one_url)
    assert latest["a"].replicas[0].engine_args == ["--x"] and latest["d"].replicas == []
    assert (latest["a"].cordoned, latest["a"].cordoned_gpus) == (True, [1])
    assert (latest["c"].cordoned, latest["c"].cordoned_gpus) == (False, [])


def test_one_node_twice_in_a_batch_is_refused(tmp_path: Path) -> None:
    sessions = make_sessionmaker(make_engine(_fresh(tmp_path, "cp.db")))
    with session_scope(sessions) as session, pytest.raises(ValueError, match="one report per node"):
        apply_reports(session=session, reports=[report("a", sequence=1), report("a", sequence=2)], now=T0)


def _writer(url: str, sizes: list[int]) -> ReportWriter:
    return ReportWriter(make_sessionmaker(make_engine(url)), lambda: T0, report_interval_seconds=5,
                        on_batch=sizes.append)


def test_reports_queued_while_the_writer_is_busy_commit_together(tmp_path: Path) -> None:
    url = _fresh(tmp_path, "cp.db")
    sizes: list[int] = []
    writer = _writer(url, sizes)
    # Another writer holds SQLite's write lock, so the first batch waits and the rest queue behind it.
    blocker = sqlite3.connect(str(tmp_path / "cp.db"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        futures = [writer.submit(report("n0", sequence=1))]
        futures += [writer.submit(report(f"n{i % 10}", sequence=1 + i // 10, sent_at=T0 + timedelta(seconds=i)))
                    for i in range(1, 30)]
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    results = [f.result(timeout=30) for f in futures]
    writer.stop()
    assert [w.verdict for w in results] == [Verdict.NEW] * 30  # a node's reports in arrival order
    assert sum(sizes) == 30 and max(sizes) >= 5
    assert {w.answer.node for w in results} == {f"n{i}" for i in range(10)}
    with make_engine(url).connect() as conn:
        nodes = conn.execute(text("SELECT name, last_sequence, reports_total FROM nodes ORDER BY name")).all()
    assert [tuple(n) for n in nodes] == [(f"n{i}", 3, 3) for i in range(10)]


def test_a_failing_report_fails_alone_and_its_batch_still_lands(tmp_path: Path) -> None:
    url = _fresh(tmp_path, "cp.db")
    engine = make_engine(url)
    with engine.begin() as conn:  # the database itself refuses one replica name
        conn.execute(text("CREATE TRIGGER refuse BEFORE INSERT ON replicas WHEN NEW.name = 'poison' "
                          "BEGIN SELECT RAISE(ABORT, 'refused by the database'); END"))
    sizes: list[int] = []
    writer = _writer(url, sizes)
    blocker = sqlite3.connect(str(tmp_path / "cp.db"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        first = writer.submit(report("warmup", sequence=1))
        good = [writer.submit(report(f"g{i}", sequence=1)) for i in range(4)]
        bad = writer.submit(report("bad", sequence=1, replicas=[replica("poison")]))
        good.append(writer.submit(report("g4", sequence=1)))
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert first.result(timeout=30)[0] == Verdict.NEW
    assert [f.result(timeout=30)[0] for f in good] == [Verdict.NEW] * 5
    with pytest.raises(Exception, match="refused by the database"):
        bad.result(timeout=30)
    writer.stop()
    with make_engine(url).connect() as conn:
        names = conn.execute(text("SELECT name FROM nodes ORDER BY name")).scalars().all()
    assert names == ["g0", "g1", "g2", "g3", "g4", "warmup"]


def test_a_stopped_writer_refuses_new_reports(tmp_path: Path) -> None:
    writer = _writer(_fresh(tmp_path, "cp.db"), [])
    assert writer.submit(report("a", sequence=1)).result(timeout=30)[0] == Verdict.NEW
    writer.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        writer.submit(report("a", sequence=2))


def test_past_its_backlog_the_writer_refuses_and_recovers(tmp_path: Path) -> None:
    url = _fresh(tmp_path, "cp.db")
    writer = ReportWriter(make_sessionmaker(make_engine(url)), lambda: T0, max_pending=3)
    blocker = sqlite3.connect(str(tmp_path / "cp.db"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        waiting = [writer.submit(report(f"n{i}", sequence=1)) for i in range(3)]
        with pytest.raises(Backlogged, match="3 reports are waiting"):
            writer.submit(report("n3", sequence=1))
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert [f.result(timeout=30)[0] for f in waiting] == [Verdict.NEW] * 3
    assert writer.pending == 0
    assert writer.submit(report("n3", sequence=1)).result(timeout=30)[0] == Verdict.NEW
    writer.stop()


def test_an_unreachable_database_fails_the_queued_reports_at_once() -> None:
    engine = create_engine(f"postgresql+psycopg://pitstop@127.0.0.1:{free_port()}/none",
                           connect_args={"connect_timeout": 2})
    writer = ReportWriter(make_sessionmaker(engine), lambda: T0)
    futures = [writer.submit(report(f"n{i}", sequence=1)) for i in range(20)]
    for f in futures:
        with pytest.raises(OperationalError):
            f.result(timeout=30)
    assert writer.pending == 0
    writer.stop()


def live(node: str) -> dict[str, Any]:
    """A report sent now, for a control plane on the real clock (it refuses a clock far from its own)."""
    return body(report(node, sent_at=datetime.now(UTC)))


def test_a_busy_control_plane_answers_503_with_retry_after(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    config = ServerConfig(database_url=f"sqlite:///{db}", agent_tokens=["agent"], max_pending_reports=1)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config, run_jobs=False), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer agent"}
    try:
        wait_until(lambda: http_ok(f"{base}/healthz"), timeout=15, what="control plane to listen")
        blocker = sqlite3.connect(str(db), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        first: list[int] = []
        sender = threading.Thread(target=lambda: first.append(probe.post(
            f"{base}/v1/agents/a/report", json=live("a"), headers=auth, timeout=30).status_code))
        try:
            sender.start()
            wait_until(lambda: "pitstop_cp_report_backlog 1.0" in probe.get(f"{base}/metrics").text,
                       timeout=10, what="the first report to wait for the database")
            busy = probe.post(f"{base}/v1/agents/b/report", json=live("b"), headers=auth, timeout=10)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        sender.join(timeout=30)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
        assert "retry later" in busy.json()["detail"]
        assert first == [200]
        again = probe.post(f"{base}/v1/agents/b/report", json=live("b"), headers=auth, timeout=10)
        assert again.status_code == 200
        assert 'pitstop_cp_reports_rejected_total{reason="backlogged"} 1.0' in probe.get(f"{base}/metrics").text
    finally:
        server.should_exit = True
        thread.join(timeout=10)
