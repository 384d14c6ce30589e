"""The outbox survives a kill -9: 500 notifications queued while their receiver is down, the control plane
killed mid-retry and started again, then the receiver brought up; every one arrives. At least once: only a
delivery in flight at the kill may arrive twice (with the receiver down, none is)."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from controlplane.notify.model import AlertView, Notification, to_json
from controlplane.store.db import make_engine, make_sessionmaker, migrate, session_scope
from controlplane.store.models import NotificationDelivery
from tests.helpers import free_port, http_ok, wait_until
from tests.integration.conftest import Processes
from tests.notify.receiving import Receiving

pytestmark = pytest.mark.slow

COUNT = 500
T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def _queue(db: Path) -> None:
    engine = make_engine(f"sqlite:///{db}")
    migrate(engine)
    now = datetime.now(UTC)  # the server's clock is the wall clock: these are due at once
    with session_scope(make_sessionmaker(engine)) as session:
        for i in range(COUNT):
            alert = AlertView(fingerprint=f"f{i}", status="firing", labels={"alertname": "pitstop-stall",
                                                                             "replica": f"r{i}"},
                              annotations={"summary": f"r{i} stalled"}, starts_at=T0, severity="page")
            n = Notification(receiver="hook", group_key=f"hook/r{i}", group_labels={"replica": f"r{i}"},
                             alerts=[alert], external_url="https://pitstop.example.internal")
            session.add(NotificationDelivery(receiver="hook", attempt=1, status="pending", response_code=None,
                                             error="", created_at=now, next_retry_at=now, group_key=n.group_key,
                                             reason="new", notification=to_json(n), alert_ids=[]))
    engine.dispose()


def _counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM notification_deliveries GROUP BY status").fetchall())


def _attempted(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM notification_deliveries WHERE attempt > 1").fetchone()[0])


def test_500_notifications_survive_a_kill_9_and_all_arrive(tmp_path: Path, processes: Processes) -> None:
    db, cp_port, hook_port = tmp_path / "cp.db", free_port(), free_port()
    _queue(db)
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump({
        "port": cp_port, "database_url": f"sqlite:///{db}", "policies_enabled": False,
        "notify_interval_seconds": 0.2, "external_url": "https://pitstop.example.internal",
        "notifier": {"receivers": [{"name": "hook", "timeout_seconds": 2, "max_attempts": 50,
                                    "alertmanager_webhook": {"url": f"http://127.0.0.1:{hook_port}/hook"}}],
                     "route": {"receiver": "hook"}, "max_retry_interval": "2s"}}))
    first = processes.start("server-1", "server", "--config", str(config))
    wait_until(lambda: http_ok(f"http://127.0.0.1:{cp_port}/healthz"), 60, what="the control plane")
    # The receiver is down: every delivery is tried, refused, and rescheduled.
    wait_until(lambda: _attempted(db) == COUNT, 90, interval=0.5, what="every delivery tried once")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    assert _counts(db) == {"pending": COUNT}, "nothing is lost or given up while the receiver is down"
    hook = Receiving(default=200, port=hook_port)
    try:
        processes.start("server-2", "server", "--config", str(config))
        wait_until(lambda: _counts(db).get("sent") == COUNT, 120, interval=0.5, what="every notification sent")
        arrived = Counter(body["groupKey"] for body in hook.bodies)
        assert set(arrived) == {f"hook/r{i}" for i in range(COUNT)}
        twice = sum(n - 1 for n in arrived.values())
        print(f"outbox after kill -9: {COUNT} queued, {len(arrived)} arrived, {twice} arrived twice")
        assert twice == 0  # nothing was in flight to a receiver that was down
    finally:
        hook.close()
