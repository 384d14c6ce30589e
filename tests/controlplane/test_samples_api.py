"""The time series the console charts: a replica's latency quantiles, and a GPU's readings by node and index."""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest
from fastapi.testclient import TestClient

from agent.wire import EngineSample, ReplicaState
from tests.controlplane.fixtures import T0, body, gpu, replica, report, transition


def _post(client: TestClient, sequence: int, *, temperatures: tuple[float, ...] = (61.0, 50.0),
          engine: EngineSample | None = None) -> None:
    status = replica("r0")
    if engine is not None:
        status = status.model_copy(update={"engine": engine})
    sent = report(sequence=sequence, sent_at=T0 + timedelta(seconds=5 * (sequence - 1)), replicas=[status],
                  gpus=[gpu(i, temperature=t) for i, t in enumerate(temperatures)])
    assert client.post("/v1/agents/gpu-a/report", json=body(sent)).status_code == 200


def test_a_replicas_samples_keep_every_latency_quantile(client: TestClient) -> None:
    _post(client, 1, engine=EngineSample(ttft_p50_seconds=0.05, ttft_p95_seconds=0.09, ttft_p99_seconds=0.12,
                                         itl_p50_seconds=0.01, itl_p95_seconds=0.018, itl_p99_seconds=0.021))
    [sample] = client.get("/v1/replicas/gpu-a/r0/samples").json()
    quantiles = {k: v for k, v in sample["values"].items() if k.startswith(("ttft_", "itl_"))}
    assert quantiles == {"ttft_p50_seconds": 0.05, "ttft_p95_seconds": 0.09, "ttft_p99_seconds": 0.12,
                         "itl_p50_seconds": 0.01, "itl_p95_seconds": 0.018, "itl_p99_seconds": 0.021}


def test_a_gpus_samples_come_oldest_first_within_the_window(client: TestClient) -> None:
    for sequence, hot in ((1, 61.0), (2, 70.0), (3, 84.0)):
        _post(client, sequence, temperatures=(hot, 50.0))
    series = client.get("/v1/gpus/gpu-a/0/samples").json()
    assert [s["values"]["temperature_celsius"] for s in series] == [61.0, 70.0, 84.0]
    assert {s["resolution_seconds"] for s in series} == {0}
    # Only GPU 0's: GPU 1's readings and the replica's are other series.
    assert {s["values"]["temperature_celsius"] for s in client.get("/v1/gpus/gpu-a/1/samples").json()} == {50.0}
    since = (T0 + timedelta(seconds=5)).isoformat()
    recent = client.get("/v1/gpus/gpu-a/0/samples", params={"since": since}).json()
    assert [s["values"]["temperature_celsius"] for s in recent] == [70.0, 84.0]
    # More points than the limit: the newest, still oldest first.
    newest = client.get("/v1/gpus/gpu-a/0/samples", params={"limit": 2}).json()
    assert [s["values"]["temperature_celsius"] for s in newest] == [70.0, 84.0]


def test_a_known_nodes_gpu_without_samples_is_an_empty_series(client: TestClient) -> None:
    _post(client, 1, temperatures=(61.0, 50.0))
    assert client.get("/v1/gpus/gpu-a/7/samples").json() == []
    # A GPU the node no longer lists keeps its history until retention takes it.
    _post(client, 2, temperatures=(62.0,))
    assert [s["values"]["temperature_celsius"] for s in client.get("/v1/gpus/gpu-a/1/samples").json()] == [50.0]


def test_an_unknown_node_is_a_404(client: TestClient) -> None:
    _post(client, 1)
    answer = client.get("/v1/gpus/gpu-z/0/samples")
    assert answer.status_code == 404 and "gpu-z" in answer.json()["detail"]


def test_events_since_a_time_with_its_offset_are_the_later_ones(client: TestClient) -> None:
    moves = [transition("r0", T0 - timedelta(seconds=30), ReplicaState.STARTING, ReplicaState.WARMING),
             transition("r0", T0 - timedelta(seconds=10), ReplicaState.WARMING, ReplicaState.READY)]
    assert client.post("/v1/agents/gpu-a/report", json=body(report(events=moves))).status_code == 200
    # The same instant written in another zone: the store compares in UTC.
    since = (T0 - timedelta(seconds=20)).astimezone(timezone(timedelta(hours=-5))).isoformat()
    later = client.get("/v1/events", params={"since": since}).json()
    assert [e["to_state"] for e in later] == ["READY"]


@pytest.mark.parametrize(("path", "params"), [
    ("/v1/gpus/gpu-a/0/samples", {"limit": 0}),
    ("/v1/gpus/gpu-a/0/samples", {"limit": 10_001}),
    ("/v1/gpus/gpu-a/0/samples", {"since": "yesterday"}),
    ("/v1/gpus/gpu-a/0/samples", {"since": "2026-11-29T12:00:00"}),  # no offset: which zone is a guess
    ("/v1/gpus/gpu-a/-1/samples", {}),
    ("/v1/gpus/gpu-a/1024/samples", {}),
    ("/v1/gpus/gpu-a/first/samples", {}),
    ("/v1/replicas/gpu-a/r0/samples", {"since": "2026-11-29T12:00:00"}),
    ("/v1/events", {"since": "2026-11-29T12:00:00"}),
    ("/v1/events", {"since": "yesterday"}),
    # Year 1 at +01:00 is before year 1 in UTC: no time the store can compare with (it was a 500).
    ("/v1/events", {"since": "0001-01-01T00:00:03+01:00"}),
    ("/v1/replicas/gpu-a/r0/samples", {"since": "0001-01-01T00:00:03+01:00"}),
])
def test_bad_parameters_are_a_422(client: TestClient, path: str, params: dict[str, object]) -> None:
    _post(client, 1)
    assert client.get(path, params=params).status_code == 422
