"""The console, run by AppTest against a real control plane served by uvicorn on a loopback port."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from agent.wire import ReplicaState
from tests.console.served import open_console, texts
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import free_port


def test_page_shows_reported_replicas(live_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)  # the server's clock is the real one: reports are sent now
    for seq, sent in ((1, now), (2, now + timedelta(seconds=5))):
        reps = [replica("chat-0", restarts=4), replica("chat-1", state=ReplicaState.BACKOFF)]
        r = report(sequence=seq, sent_at=sent, replicas=reps)
        httpx.post(f"{live_api}/v1/agents/gpu-a/report", json=body(r), timeout=10,
                   headers={"Authorization": "Bearer agent"}).raise_for_status()
    page = open_console(monkeypatch, live_api, "look")
    assert not page.error
    assert "**tiny-llama** · 1 of 2 serving" in texts(page)  # the Fleet page, first
    page.switch_page("views/replicas.py").run()
    assert not page.exception and not page.error
    assert [w.value for w in page.warning] == ["replica gpu-a/chat-1 is BACKOFF after 0 restarts"]
    replicas = next(df.value for df in page.dataframe if "engine flags" in df.value.columns)
    assert list(replicas["replica"]) == ["gpu-a/chat-0", "gpu-a/chat-1"]
    assert list(replicas["state"]) == ["READY", "BACKOFF"]
    assert list(replicas["restarts"]) == [4, 0] and list(replicas["TTFT p99 ms"]) == [120.0, 120.0]
    # Two samples of the first replica: its latency, throughput, queue and memory are charted.
    assert page.selectbox(key="chart_replica").value == "gpu-a/chat-0"
    assert len(page.get("vega_lite_chart")) == 4
    assert "INFO started" in texts(page)  # the chosen replica's log tail
    page.switch_page("views/nodes.py").run()
    nodes = next(df.value for df in page.dataframe if "last report" in df.value.columns)
    assert list(nodes["status"]) == ["up"]


def test_page_explains_a_refused_token(live_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    page = open_console(monkeypatch, live_api, None)
    assert not page.dataframe and [b.label for b in page.main.button] == ["Sign in"]
    page = open_console(monkeypatch, live_api, "stolen")
    assert "token" in page.error[0].value and not page.dataframe


def test_page_explains_an_unreachable_api(monkeypatch: pytest.MonkeyPatch) -> None:
    page = open_console(monkeypatch, f"http://127.0.0.1:{free_port()}", "look")
    message = page.error[0].value
    assert "Control plane unavailable" in message and "pitstop server" in message
