"""The console, run by AppTest against a real control plane served by uvicorn on a loopback port."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent.wire import ReplicaState
from bench.harness.http import probe
from tests.console.served import open_console, texts
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import free_port


def test_page_shows_reported_replicas(live_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)  # the server's clock is the real one: reports are sent now
    for seq, sent in ((1, now), (2, now + timedelta(seconds=5))):
        reps = [replica("chat-0", restarts=4), replica("chat-1", state=ReplicaState.BACKOFF)]
        r = report(sequence=seq, sent_at=sent, replicas=reps)
        probe.post(f"{live_api}/v1/agents/gpu-a/report", json=body(r), timeout=10,
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
    # Two samples of the first replica: its TTFT and ITL, queue, memory and GPU 0's temperature are charted; it
    # reported no token rate, and the page says so in that chart's place.
    assert page.selectbox(key="chart_replica").value is None  # the table first; one replica's page on demand
    page.selectbox(key="chart_replica").select("gpu-a/chat-0").run()
    assert len(page.get("vega_lite_chart")) == 5
    assert "No token rate in this window" in texts(page)
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


def test_the_replicas_page_reads_one_page_of_a_big_fleet(live_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """270 replicas: the page shows 200 and says of how many; the next page, a filter and the fleet-wide warning
    are the control plane's to answer, not a filter over every replica read."""
    now = datetime.now(UTC)
    nodes = ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e")
    for node in nodes:  # 54 each: a report carries at most 64
        reps = [replica(f"r{i:02d}", state=ReplicaState.FATAL if (node, i) == ("gpu-e", 53) else ReplicaState.READY)
                for i in range(54)]
        probe.post(f"{live_api}/v1/agents/{node}/report", json=body(report(node, sent_at=now, replicas=reps)),
                   timeout=10, headers={"Authorization": "Bearer agent"}).raise_for_status()
    page = open_console(monkeypatch, live_api, "look", page="views/replicas.py")
    assert not page.exception and not page.error

    def shown() -> list[str]:
        return list(next(df.value for df in page.dataframe if "engine flags" in df.value.columns)["replica"])

    assert len(shown()) == 200 and shown()[0] == "gpu-a/r00"
    assert "showing 200 of 270 replicas · rows 1 to 200, page 1 of 2" in texts(page)
    # Off this page, and named all the same.
    assert [w.value for w in page.warning] == ["replica gpu-e/r53 is FATAL after 0 restarts"]
    page.number_input(key="table_page").set_value(2).run()
    assert shown() == [f"gpu-d/r{i:02d}" for i in range(38, 54)] + [f"gpu-e/r{i:02d}" for i in range(54)]
    assert "showing 70 of 270 replicas · rows 201 to 270, page 2 of 2" in texts(page)
    page.selectbox(key="chart_replica").select("gpu-d/r38").run()
    assert "INFO started" in texts(page)
    # Past the end, as when the fleet shrinks under the page: the last page instead.
    page.number_input(key="table_page").set_value(9).run()
    assert page.number_input(key="table_page").value == 2 and len(shown()) == 70
    # A filter starts again at its first page.
    page.multiselect(key="filter_node").select("gpu-b").run()
    assert shown() == [f"gpu-b/r{i:02d}" for i in range(54)]
    assert "showing 54 of 54 matching replicas (270 in all)" in texts(page)
    assert page.multiselect(key="filter_node").options == list(nodes)
