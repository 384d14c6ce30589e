"""``GET /v1/replicas?view=table``: the console's page of the replicas, filtered, sorted and paged by the control
plane with the total and the values to filter by; and the full view, which stays every match as ``ReplicaOut``."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from agent.wire import EngineSample, ReplicaState, ReplicaStatus, salvage
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.fleet.queries import reading
from controlplane.fleet.schemas import EngineColumns, ReplicaOut, ReplicaRow
from controlplane.store.db import session_scope
from controlplane.store.models import Node, Replica
from tests.controlplane.fixtures import FakeClock, body, replica, report

AGENT = {"Authorization": "Bearer agent"}
VIEWER = {"Authorization": "Bearer look"}


def _replica(name: str, *, ttft: float | None = 0.12, restarts: int = 0, model: str = "tiny-llama",
             state: ReplicaState = ReplicaState.READY, flags: tuple[str, ...] = ("--max-num-seqs", "64"),
             ) -> ReplicaStatus:
    r = replica(name, state=state, restarts=restarts, model=model)
    assert r.engine is not None
    engine = None if ttft is None else r.engine.model_copy(update={"ttft_p99_seconds": ttft})
    return r.model_copy(update={"engine": engine, "engine_args": list(flags)})


# Two nodes, two models; gpu-b/r0 has no engine sample (no TTFT to sort by), gpu-a/r2 and gpu-b/r2 tie.
FLEET = {
    "gpu-a": [_replica("r0", ttft=0.30), _replica("r1", ttft=0.10, restarts=3, state=ReplicaState.BACKOFF),
              _replica("r2", ttft=0.20, model="mistral-7b", flags=("--enforce-eager",))],
    "gpu-b": [_replica("r0", ttft=None, state=ReplicaState.WEDGED), _replica("r2", ttft=0.20, restarts=3)],
}


@pytest.fixture
def c(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, agent_tokens=["agent"], viewer_tokens=["look"],
                          stale_after_seconds=60)
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        for node, replicas in FLEET.items():
            sent = report(node, replicas=replicas, sent_at=clock())
            assert client.post(f"/v1/agents/{node}/report", json=body(sent), headers=AGENT).status_code == 200
        yield client


def table(c: TestClient, **params: Any) -> dict[str, Any]:
    got = c.get("/v1/replicas", params={"view": "table", **params}, headers=VIEWER)
    assert got.status_code == 200, got.text
    out: dict[str, Any] = got.json()
    return out


def keys(page: dict[str, Any]) -> list[str]:
    return [f"{r['node']}/{r['name']}" for r in page["replicas"]]


def test_the_table_is_a_page_of_lean_rows_with_the_total_and_the_fleets_facets(c: TestClient) -> None:
    page = table(c)
    assert (page["total"], page["offset"], page["limit"], page["sort"]) == (5, 0, 100, "node")
    assert keys(page) == ["gpu-a/r0", "gpu-a/r1", "gpu-a/r2", "gpu-b/r0", "gpu-b/r2"]
    # Only the table's columns: no log tail, URL or canary, and of the samples only what a column shows.
    first = page["replicas"][0]
    assert set(first) == set(ReplicaRow.model_fields) and "log_tail" not in first
    assert set(first["engine"]) == set(EngineColumns.model_fields)
    assert first["process"] == {"rss_bytes": 1_800 * 1024**2}
    assert first["engine"]["ttft_p99_seconds"] == 0.3 and first["engine"]["kv_cache_usage_ratio"] == 0.42
    assert first["engine_args"] == ["--max-num-seqs", "64"] and first["node_status"] == "up"
    assert page["replicas"][3]["engine"] is None  # gpu-b/r0 sent no engine sample
    assert page["facets"] == {"model": {"mistral-7b": 1, "tiny-llama": 4}, "node": {"gpu-a": 3, "gpu-b": 2},
                              "state": {"BACKOFF": 1, "READY": 3, "WEDGED": 1}}


def test_filters_match_any_of_their_values_and_the_facets_stay_the_fleets(c: TestClient) -> None:
    assert keys(table(c, model="mistral-7b")) == ["gpu-a/r2"]
    assert keys(table(c, node="gpu-b")) == ["gpu-b/r0", "gpu-b/r2"]
    # Repeated: any of them; a state in any case.
    both = table(c, state=["backoff", "WEDGED"])
    assert keys(both) == ["gpu-a/r1", "gpu-b/r0"] and both["total"] == 2
    assert both["facets"] == table(c)["facets"]  # what a filter can pick, whatever is picked now
    assert keys(table(c, node="gpu-a", model=["tiny-llama", "mistral-7b"], state="READY")) == ["gpu-a/r0", "gpu-a/r2"]
    # Text: in node/name or the flags joined by spaces, any case.
    assert keys(table(c, q="GPU-B/")) == ["gpu-b/r0", "gpu-b/r2"]
    assert keys(table(c, q="num-seqs 64", node="gpu-a")) == ["gpu-a/r0", "gpu-a/r1"]
    assert keys(table(c, q="EAGER")) == ["gpu-a/r2"]
    none = table(c, model="nobody")
    assert none["total"] == 0 and none["replicas"] == [] and none["facets"]["node"] == {"gpu-a": 3, "gpu-b": 2}
    # The full view takes the repeated filters too, and stays a list of ReplicaOut.
    full = c.get("/v1/replicas", params={"state": ["BACKOFF", "wedged"]}, headers=VIEWER).json()
    assert [f"{r['node']}/{r['name']}" for r in full] == ["gpu-a/r1", "gpu-b/r0"]
    assert set(full[0]) == set(ReplicaOut.model_fields) and full[0]["log_tail"] == ["INFO started"]


def test_sorts_put_unknown_readings_last_and_break_ties_by_node_then_name(c: TestClient) -> None:
    assert keys(table(c, sort="-ttft_p99_seconds")) == ["gpu-a/r0", "gpu-a/r2", "gpu-b/r2", "gpu-a/r1", "gpu-b/r0"]
    assert keys(table(c, sort="ttft_p99_seconds")) == ["gpu-a/r1", "gpu-a/r2", "gpu-b/r2", "gpu-a/r0", "gpu-b/r0"]
    assert keys(table(c, sort="-restarts_total")) == ["gpu-a/r1", "gpu-b/r2", "gpu-a/r0", "gpu-a/r2", "gpu-b/r0"]
    assert keys(table(c, sort="-node")) == ["gpu-b/r2", "gpu-b/r0", "gpu-a/r2", "gpu-a/r1", "gpu-a/r0"]
    assert keys(table(c, sort="name")) == ["gpu-a/r0", "gpu-b/r0", "gpu-a/r1", "gpu-a/r2", "gpu-b/r2"]
    assert keys(table(c, sort="model"))[0] == "gpu-a/r2"
    assert table(c, sort="-rss_bytes")["sort"] == "-rss_bytes"


def test_pages_neither_skip_nor_repeat_a_row(c: TestClient) -> None:
    whole = keys(table(c, sort="-ttft_p99_seconds"))
    pages = [table(c, sort="-ttft_p99_seconds", limit=2, offset=offset) for offset in (0, 2, 4)]
    assert [k for p in pages for k in keys(p)] == whole
    assert [len(p["replicas"]) for p in pages] == [2, 2, 1] and {p["total"] for p in pages} == {5}
    past = table(c, offset=10)
    assert past["replicas"] == [] and past["total"] == 5


def test_a_silent_nodes_rows_say_it_is_stale(c: TestClient, clock: FakeClock) -> None:
    clock.advance(61)
    assert {r["node_status"] for r in table(c)["replicas"]} == {"stale"}


def _set_engine(c: TestClient, node: str, name: str, engine: dict[str, Any]) -> None:
    """Write a stored sample as an older control plane might have kept it, past today's wire bounds."""
    with session_scope(c.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        session.execute(update(Replica).where(Replica.node == node, Replica.name == name).values(engine=engine))


def test_a_stored_reading_out_of_bounds_reads_as_unknown_in_every_view(c: TestClient) -> None:
    _set_engine(c, "gpu-a", "r0", {"ttft_p99_seconds": -1.0, "itl_p99_seconds": 0.021, "requests_per_second": 5})
    row = table(c)["replicas"][0]
    assert row["engine"]["ttft_p99_seconds"] is None and row["engine"]["itl_p99_seconds"] == 0.021
    full = c.get("/v1/replicas", params={"node": "gpu-a"}, headers=VIEWER).json()[0]
    assert full["engine"]["ttft_p99_seconds"] is None  # salvaged alike
    assert keys(table(c, sort="-ttft_p99_seconds"))[-2:] == ["gpu-a/r0", "gpu-b/r0"]  # unknown: last
    # The summary reads it as unknown too: the worst READY TTFT is gpu-b/r2's, not a negative one.
    llama = next(m for m in c.get("/v1/summary", headers=VIEWER).json()["models"] if m["model"] == "tiny-llama")
    assert next(o for o in llama["objectives"] if o["name"] == "ttft_p99")["value"] == 0.2


@pytest.mark.parametrize("value", [0, 0.5, 3, -0.0, 1e308, -1, -1e-9, math.inf, -math.inf, math.nan, None])
def test_a_reading_is_kept_exactly_when_the_wire_would_keep_it(value: float | None) -> None:
    sample = {} if value is None else {"ttft_p99_seconds": value}
    assert reading(sample, "ttft_p99_seconds") == salvage(EngineSample, sample).ttft_p99_seconds


def test_the_summary_counts_cordoned_and_stale_nodes(c: TestClient, clock: FakeClock) -> None:
    with session_scope(c.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        session.execute(update(Node).where(Node.name == "gpu-b").values(cordoned=True))
    nodes = c.get("/v1/summary", headers=VIEWER).json()["nodes"]
    assert nodes == {"total": 2, "up": 2, "stale": 0, "cordoned": 1}
    clock.advance(61)
    assert c.get("/v1/summary", headers=VIEWER).json()["nodes"] == {"total": 2, "up": 0, "stale": 2, "cordoned": 1}


@pytest.mark.parametrize(("params", "name"), [
    ({"view": "table", "sort": "ttft"}, "sort"),
    ({"view": "table", "sort": "--node"}, "sort"),
    ({"view": "table", "limit": 0}, "limit"),
    ({"view": "table", "limit": 1001}, "limit"),
    ({"view": "table", "offset": -1}, "offset"),
    ({"view": "table", "q": "x" * 201}, "q"),
    ({"view": "tabel"}, "view"),
    # Paging is the table's: a page of the full view would carry no total to say it is one.
    ({"limit": 10}, "limit"),
    ({"offset": 10}, "offset"),
    ({"sort": "-ttft_p99_seconds"}, "sort"),
    ({"q": "r0"}, "q"),
])
def test_bad_values_are_refused_naming_the_parameter(c: TestClient, params: dict[str, Any], name: str) -> None:
    got = c.get("/v1/replicas", params=params, headers=VIEWER)
    assert got.status_code == 422, got.text
    assert [e["loc"] for e in got.json()["detail"]] == [["query", name]]
