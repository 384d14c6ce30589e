"""Every page of the console, opened by an operator on an empty fleet, a healthy one and one in trouble, over
real HTTP to a real control plane: what on-call reads in the first seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests.console.fleets import FLEETS
from tests.console.served import PAGES, buttons, charts, choose_replica, open_console, serve, texts


@pytest.fixture(scope="module", params=sorted(FLEETS))
def fleet_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    agents, build = FLEETS[request.param]()
    with serve(tmp_path_factory.mktemp(request.param), agents, build) as url:
        yield request.param, url


def _open(fleet_url: tuple[str, str], page: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, AppTest]:
    kind, url = fleet_url
    at = open_console(monkeypatch, url, "op", page=page)
    assert not at.error or kind == "trouble", [e.value for e in at.error]
    assert "last updated" in texts(at)
    return kind, at


def _table(at: AppTest, column: str) -> pd.DataFrame:
    return next(df.value for df in at.dataframe if column in df.value.columns)


def test_fleet_page(fleet_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    kind, at = _open(fleet_url, "views/fleet.py", monkeypatch)
    said = texts(at)
    if kind == "empty":
        assert "No replica has reported yet" in said and "No actions yet" in said
        assert buttons(at) == []
        return
    assert "Automation running, circuit breaker closed." in said
    if kind == "healthy":
        assert ":green[:material/check_circle:] **tiny-llama** · 2 of 2 serving · 200 tokens/s" in said
        assert ":green-badge[TTFT p99 120 ms / 500 ms]" in said and ":green-badge[2 READY]" in said
    else:
        assert ":red[:material/error:] **tiny-llama** · 2 of 3 serving" in said
        assert ":red-badge[TTFT p99 2000 ms / 500 ms]" in said and ":violet-badge[1 WEDGED]" in said
        assert any("pitstop-ttft-slo on replica:gpu-a/r1" in w.value for w in at.warning)
        done = _table(at, "outcome")
        restart = done[done["kind"] == "restart"].iloc[0]
        assert restart["target"] == "replica:gpu-a/r0" and restart["state"] == "running"
    assert buttons(at) == ["Rolling restart of tiny-llama", "Set --max-num-seqs 64 on tiny-llama"]


def test_nodes_page(fleet_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    kind, at = _open(fleet_url, "views/nodes.py", monkeypatch)
    said = texts(at)
    if kind == "empty":
        assert "No node has reported yet." in said
        return
    assert "**gpu-a** (gpu-a.example) · agent 0.1.0 · last report 0s ago" in said
    assert ":green-badge[70 / 141 GiB]" in said
    if kind == "healthy":
        assert ":green-badge[60 °C / slows at 89]" in said and not at.warning
    else:
        # Past this GPU's own slowdown threshold, as NVML reported it.
        assert ":red-badge[90 °C / slows at 89]" in said
        assert [w.value for w in at.warning] == ["GPU gpu-a#0 at 90 °C, slowdown at 89 °C"]
    assert buttons(at) == ["Cordon node gpu-a", "Cordon GPU 0 of gpu-a"]


def test_replicas_page(fleet_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    kind, at = _open(fleet_url, "views/replicas.py", monkeypatch)
    if kind == "empty":
        assert "No replicas reported." in texts(at)
        return
    table = _table(at, "engine flags")
    expected = {"healthy": ["READY", "READY"], "trouble": ["WEDGED", "READY", "READY"]}[kind]
    assert list(table["state"]) == expected and set(table["engine flags"]) == {"--max-num-seqs 64"}
    assert f"showing {len(expected)} of {len(expected)} replicas" in texts(at)
    # Named from the fleet's own read of the troubled states, whatever page is shown.
    assert [w.value for w in at.warning] == {"healthy": [], "trouble": [
        "replica gpu-a/r0 is WEDGED: out of rotation, canaries fail and no token moves"]}[kind]
    # Since its state_since, an hour before the fleet's clock started, as of its last report.
    assert table["uptime"].iloc[0] == {"healthy": "55m 30s", "trouble": "57m 0s"}[kind]
    at.selectbox(key="chart_replica").select("gpu-a/r0").run()
    assert "INFO engine started" in texts(at)  # the log tail
    drawn = charts(at)
    # TTFT and ITL quantiles, tokens/s, queue, memory, GPU 0's temperature; the timeline in trouble. The simulated
    # engine reads no end-to-end latency, and the page says so in that chart's place.
    assert len(drawn) == (7 if kind == "trouble" else 6)
    assert "No end-to-end latency in this window" in texts(at)
    quantiles = {"healthy": {"p50", "p95", "p99"}, "trouble": {"p99"}}[kind]  # the trouble fleet sends only p99
    for (spec, [points]), p99 in zip(drawn[:2], (120.0, 20.0), strict=True):
        assert spec["encoding"]["color"]["scale"]["domain"] == ["p50", "p95", "p99"]  # one colour per quantile
        assert set(points["series"]) == quantiles and set(points[points["series"] == "p99"]["value"]) == {p99}
    # GPU 0 against its own slowdown threshold, drawn as a rule: trouble's ran past it.
    spec, layers = drawn[5]
    line = next(f for f in layers if "series" in f.columns)
    assert "layer" in spec and [f["value"].tolist() for f in layers if "limit" in f.columns] == [[89.0]]
    assert set(line["series"]) == {"GPU 0"} and line["value"].max() == (90.0 if kind == "trouble" else 60.0)
    assert "GPU 0 temperature (°C); dashed: it slows down at 89 °C" in texts(at)
    if kind == "trouble":
        assert "2 canaries failed and no token moved" in list(_table(at, "message")["message"])
        at.selectbox(key="table_sort").select("TTFT p99, slowest first").run()
        # r1 at 2 s, far over its target, first; r0 reads no TTFT (its engine sends nothing), so last.
        assert list(_table(at, "engine flags")["replica"]) == ["gpu-a/r1", "gpu-a/r2", "gpu-a/r0"]
        # The filters are the control plane's: the page reads only what matches, and says so.
        assert at.multiselect(key="filter_state").options == ["READY", "WEDGED"]
        at.multiselect(key="filter_state").select("WEDGED").run()
        assert list(_table(at, "engine flags")["replica"]) == ["gpu-a/r0"]
        assert "showing 1 of 1 matching replicas (3 in all)" in texts(at)
        at.text_input(key="filter_text").input("nothing-like-it").run()
        assert "No replica matches these filters." in texts(at)
        assert "chart_replica" not in [box.key for box in at.selectbox]  # no replica to show
        at.text_input(key="filter_text").input("").run()
        choose_replica(at, "gpu-a/r0")  # its page closed with the list that had none
    assert buttons(at) == ["Restart", "Drain"]


def test_actions_page(fleet_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    kind, at = _open(fleet_url, "views/actions.py", monkeypatch)
    said = texts(at)
    assert "Circuit breaker closed: automation is running." in said
    if kind != "trouble":
        assert "No actions yet: no policy has proposed anything." in said
        return
    rows = _table(at, "guardrails")
    assert {"stall", "ttft-slo"} <= set(rows["policy"])
    restart = next(i for i, label in enumerate(at.selectbox(key="action_detail").options) if "restart" in label)
    at.selectbox(key="action_detail").select_index(restart).run()
    said = texts(at)
    assert "**#1 restart replica:gpu-a/r0: running** · proposed by stall (requested by policy)" in said
    trail = _table(at, "why")
    assert list(trail["to"]) == ["approved", "running"]
    assert "stall on gpu-a/r0" in said  # the evidence
    assert "Captured before the restart" in said  # what it keeps of the wedged engine


def test_alerts_page(fleet_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    kind, at = _open(fleet_url, "views/alerts.py", monkeypatch)
    said = texts(at)
    assert "No silence active or recent." in said
    if kind != "trouble":
        assert "No alerts." in said
        return
    rows = _table(at, "muted by")
    assert set(rows["state"]) == {"firing"} and {"pitstop-stall", "pitstop-ttft-slo"} == set(rows["alert"])
    # The silence form comes prefilled with the chosen alert's own labels.
    chosen = at.selectbox(key="alert_detail").value
    [matchers] = [t for t in at.text_area if t.key == f"silence_matchers_{chosen}"]
    first, prefilled = rows.iloc[0], str(matchers.value)
    assert f'alertname="{first["alert"]}"' in prefilled and f'target="{first["target"]}"' in prefilled


def test_policies_page(fleet_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    kind, at = _open(fleet_url, "views/policies.py", monkeypatch)
    rows = _table(at, "would").set_index("policy")
    assert rows.loc["stall", "mode"] == "active" and rows.loc["ttft-slo", "watches"] == "ttft_p99_seconds"
    if kind == "trouble":
        # It fired already: what it would do now is held by its cooldown, and the page says so.
        assert "alert replica:gpu-a/r1: suppressed by cooldown" in rows.loc["ttft-slo", "would"]
    else:
        assert set(rows["now"]) <= {"quiet", "disabled"}


@pytest.mark.parametrize("page", PAGES)
def test_a_viewer_sees_every_page_and_no_button(fleet_url: tuple[str, str], page: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = fleet_url
    at = open_console(monkeypatch, url, "look")
    assert [m.value for m in at.sidebar.markdown] == ["**config:viewer-0 (viewer)**"]
    assert "Read only: no action buttons." in [c.value for c in at.sidebar.caption]
    at.switch_page(page).run()
    assert not at.exception and "last updated" in texts(at)
    assert buttons(at) == [] and not at.get("form")
