"""Readings an agent kept through a partition are stored in place, once, and a bad one is refused alone."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from agent.wire import PROTOCOL_VERSION, NodeReport
from controlplane.remediation.history import SampleHistory
from controlplane.remediation.snapshot import build_snapshot
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import T0, FakeClock, body, gpu, replica, report

READINGS = "/v1/agents/gpu-a/readings"


def _reading(i: int, *, ttft: float = 0.3, **kw: Any) -> NodeReport:
    """The reading taken ``10 * i`` s after T0 (report number ``i + 1``)."""
    kw.setdefault("replicas", [replica("r0", ttft=ttft)])
    return report(sequence=i + 1, sent_at=T0 + timedelta(seconds=10 * i), **kw)


def _batch(*readings: NodeReport, node: str = "gpu-a") -> dict[str, Any]:
    return {"protocol_version": PROTOCOL_VERSION, "node": node, "readings": [body(r) for r in readings]}


def _ttfts(client: TestClient) -> list[tuple[str, float]]:
    return [(s["at"], s["values"]["ttft_p99_seconds"]) for s in client.get("/v1/replicas/gpu-a/r0/samples").json()]


def _fleet(client: TestClient) -> dict[str, Any]:
    return {path: client.get(path).json() for path in ("/v1/nodes", "/v1/replicas", "/v1/gpus", "/v1/events")}


def _partitioned(client: TestClient, clock: FakeClock) -> None:
    """The agent reported at 0 s, went dark, and reported again at 60 s (latency up to 0.9 s meanwhile)."""
    assert client.post("/v1/agents/gpu-a/report", json=body(_reading(0, ttft=0.1))).status_code == 200
    clock.now = T0 + timedelta(seconds=61)
    assert client.post("/v1/agents/gpu-a/report", json=body(_reading(6, ttft=0.9))).status_code == 200


def test_kept_readings_fill_the_hole_without_moving_now(client: TestClient, clock: FakeClock) -> None:
    _partitioned(client, clock)
    before = _fleet(client)
    answer = client.post(READINGS, json=_batch(*(_reading(i, ttft=0.1 * (i + 1)) for i in range(1, 6))))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"stored": 5, "duplicates": 0, "refused": []}
    # The hole is filled, in time order; the node's and the replica's "now" are the 60 s report's still.
    assert [round(v, 1) for _, v in _ttfts(client)] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9]
    assert _fleet(client) == before
    [node] = client.get("/v1/nodes").json()
    assert node["last_sequence"] == 7


def test_a_reading_sent_twice_is_stored_once(client: TestClient, clock: FakeClock) -> None:
    _partitioned(client, clock)
    batch = _batch(*(_reading(i) for i in range(1, 6)))
    assert client.post(READINGS, json=batch).json()["stored"] == 5
    # The answer was lost and the agent sent them again, with one the live path had stored already (0 s).
    again = client.post(READINGS, json=_batch(_reading(0), *(_reading(i) for i in range(1, 6))))
    assert again.json() == {"stored": 0, "duplicates": 6, "refused": []}
    assert len(_ttfts(client)) == 7


def test_a_policy_round_after_the_heal_sees_a_continuous_history(client: TestClient, clock: FakeClock) -> None:
    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    cache = SampleHistory(timedelta(minutes=5))
    _partitioned(client, clock)
    with session_scope(ctx.sessions) as session:  # the leader's round during the partition's aftermath
        build_snapshot(session=session, now=clock.now, history=timedelta(minutes=5), samples=cache)
    client.post(READINGS, json=_batch(*(_reading(i, ttft=0.1 * (i + 1)) for i in range(1, 6))))
    with session_scope(ctx.sessions) as session:
        snap = build_snapshot(session=session, now=clock.now, history=timedelta(minutes=5), samples=cache)
    [r0] = snap.replicas
    assert [round(s.ttft_p99_seconds or 0, 1) for s in r0.history] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9]
    assert [(s.at - T0).total_seconds() for s in r0.history] == [0, 10, 20, 30, 40, 50, 60]


def test_bad_readings_are_refused_one_by_one_and_the_rest_stored(client: TestClient, clock: FakeClock) -> None:
    _partitioned(client, clock)
    clock.now = T0 + timedelta(hours=2)
    before = _fleet(client)
    readings = [
        report(sequence=2, sent_at=T0 + timedelta(minutes=70)),  # fine
        report(sequence=3, sent_at=T0 + timedelta(seconds=30)),  # older than the hour kept at full resolution
        report(sequence=4, sent_at=T0 + timedelta(hours=2, minutes=6)),  # six minutes ahead of the clock
        # A replica and a GPU the node no longer has: those parts refused, r0's and GPU 0's stored.
        report(sequence=5, sent_at=T0 + timedelta(minutes=80), replicas=[replica("r0"), replica("gone")],
               gpus=[gpu(0), gpu(7)]),
    ]
    answer = client.post(READINGS, json=_batch(*readings))
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert (result["stored"], result["duplicates"]) == (2, 0)
    refused = {(r["sequence"], r["subject"]): r["reason"] for r in result["refused"]}
    assert set(refused) == {(3, None), (4, None), (5, "replica gone"), (5, "gpu 7")}
    assert "older than the store's full-resolution window" in refused[3, None]
    assert "360 s ahead of the control plane's clock" in refused[4, None]
    assert "no longer runs replica gone" in refused[5, "replica gone"]
    assert [at[11:16] for at, _ in _ttfts(client)] == ["12:00", "12:01", "13:10", "13:20"]
    assert client.get("/v1/replicas/gpu-a/gone/samples").json() == []
    assert len(client.get("/v1/gpus/gpu-a/0/samples").json()) == 4
    assert _fleet(client) == before


def test_readings_of_a_node_the_fleet_does_not_hold_are_refused(client: TestClient) -> None:
    answer = client.post("/v1/agents/gpu-z/readings", json=_batch(_reading(1, node="gpu-z"), node="gpu-z"))
    assert answer.status_code == 200
    [refused] = answer.json()["refused"]
    assert "node gpu-z is not in the fleet" in refused["reason"]
    assert client.get("/v1/nodes").json() == []


def test_a_malformed_batch_is_refused_whole_and_stores_nothing(client: TestClient, clock: FakeClock) -> None:
    _partitioned(client, clock)
    other = client.post(READINGS, json=_batch(_reading(1), _reading(2, node="gpu-b")))
    assert other.status_code == 400 and "gpu-a" in other.text
    broken = _batch(_reading(1))
    broken["readings"][0]["sequence"] = "many"
    bad = client.post(READINGS, content=json.dumps(broken).encode(), headers={"content-type": "application/json"})
    assert bad.status_code == 422 and "sequence" in bad.text
    assert len(_ttfts(client)) == 2
