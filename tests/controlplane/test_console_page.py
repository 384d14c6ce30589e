"""The Streamlit page, run by AppTest against a real control plane served by uvicorn on a loopback port."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from agent.wire import ReplicaState
from controlplane.console import app as console_app
from controlplane.console.client import ENV_API_URL, ENV_TOKEN
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import free_port

APP_PATH = str(Path(console_app.__file__))


def run_page(monkeypatch: pytest.MonkeyPatch, api_url: str, token: str | None) -> AppTest:
    monkeypatch.setenv(ENV_API_URL, api_url)
    if token:
        monkeypatch.setenv(ENV_TOKEN, token)
    else:
        monkeypatch.delenv(ENV_TOKEN, raising=False)
    page = AppTest.from_file(APP_PATH, default_timeout=30)
    page.run()
    assert not page.exception, page.exception
    return page


def test_page_shows_reported_replicas(live_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)  # the server's clock is the real one: reports are sent now
    for seq, sent in ((1, now), (2, now + timedelta(seconds=5))):
        reps = [replica("chat-0", restarts=4), replica("chat-1", state=ReplicaState.BACKOFF)]
        r = report(sequence=seq, sent_at=sent, replicas=reps)
        httpx.post(f"{live_api}/v1/agents/gpu-a/report", json=body(r), timeout=10,
                   headers={"Authorization": "Bearer agent"}).raise_for_status()
    page = run_page(monkeypatch, live_api, "look")
    assert not page.error
    assert [w.value for w in page.warning] == ["replica gpu-a/chat-1 is BACKOFF after 0 restarts"]
    tables = [df.value for df in page.dataframe]
    replicas = next(t for t in tables if "replica" in t.columns)
    assert list(replicas["replica"]) == ["chat-0", "chat-1"]
    assert list(replicas["state"]) == ["READY", "BACKOFF"]
    assert list(replicas["restarts"]) == [4, 0] and list(replicas["TTFT p99 ms"]) == [120.0, 120.0]
    nodes = next(t for t in tables if "last report" in t.columns)
    assert list(nodes["status"]) == ["up"]
    assert {m.label: m.value for m in page.metric}["ready replicas"] == "1"
    # Two samples of the first replica: its TTFT and RSS history is charted.
    assert page.selectbox[0].value == "gpu-a/chat-0"
    assert len(page.get("vega_lite_chart")) == 2
    assert "INFO started" in page.code[0].value  # the chosen replica's log tail


def test_page_explains_a_refused_token(live_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    page = run_page(monkeypatch, live_api, None)
    assert "token" in page.error[0].value and not page.dataframe


def test_page_explains_an_unreachable_api(monkeypatch: pytest.MonkeyPatch) -> None:
    page = run_page(monkeypatch, f"http://127.0.0.1:{free_port()}", None)
    message = page.error[0].value
    assert "Control plane unavailable" in message and "pitstop server" in message
