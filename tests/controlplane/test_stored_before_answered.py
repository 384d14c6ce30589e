"""A write is stored before it is answered: a client told that a write succeeded reads it back at once.

Over real HTTP (uvicorn), where the order matters: a person resets the breaker from the console and the next
page read must show it closed; a commit that fails must come back as an error, not after a 200.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from bench.harness.http import probe
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.remediation import breaker
from controlplane.store.db import session_scope
from controlplane.store.models import BreakerState
from tests.helpers import serve_in_thread

OPERATOR = {"Authorization": "Bearer op"}


def test_an_operators_write_is_committed_before_the_answer_goes_out(tmp_path: Path) -> None:
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", operator_tokens=["op"])
    app = create_app(config, run_jobs=False)
    sessions = app.state.pitstop.sessions
    with session_scope(sessions) as session:
        breaker.trip(session=session, reason="2 failed actions", now=datetime.now(UTC))

    order: list[str] = []
    answered = threading.Event()

    @event.listens_for(sessions, "after_flush")
    def wrote(session: Session, _: Any) -> None:
        if any(isinstance(row, BreakerState) for row in (*session.new, *session.dirty)):
            session.info["breaker"] = True

    @event.listens_for(sessions, "before_commit")
    def hold(session: Session) -> None:
        if session.info.pop("breaker", False):
            # An answer sent before this commit reaches the client meanwhile, and the client says so.
            answered.wait(2.0)
            order.append("stored")

    with serve_in_thread(app) as url:
        done = probe.post(f"{url}/v1/remediation/breaker/reset", headers=OPERATOR, timeout=30)
        order.append("answered")
        answered.set()
        assert done.status_code == 200, done.text
        assert order == ["stored", "answered"]
        read = probe.get(f"{url}/v1/remediation/breaker", headers=OPERATOR, timeout=30).json()
        assert read["tripped"] is False and read["reset_by"] == "config:operator-0"
