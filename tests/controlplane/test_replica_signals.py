"""A replica's signals end to end: a status in a report, through the real ingest into the store, back through the
history's read and out of the API, each signal as its table (``policy.signals``) declares it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from agent.wire import EngineSample, EngineWindow, ProcessSample, ReplicaState, ReplicaStatus, WindowHistogram
from controlplane.policy.signals import DECLARED, ROLLUPS, SIGNALS, ReplicaSample, from_stored
from controlplane.remediation.history import SampleHistory
from controlplane.retention import downsample
from controlplane.store.db import session_scope
from controlplane.store.samples import series_of
from tests.controlplane.fixtures import T0, body, report


def every_signal() -> ReplicaStatus:
    """A replica's status with a value, none of them a default, for every signal of the table."""
    window = EngineWindow(ended_at=T0 - timedelta(seconds=1), seconds=5.0, steps=40.0,
                          ttft=WindowHistogram(bounds=[0.1, 0.5], counts=[3.0, 1.0, 0.0]),
                          itl=WindowHistogram(bounds=[0.05, 0.1], counts=[30.0, 10.0, 2.0]))
    return ReplicaStatus(
        name="r0", model="tiny-llama", url="http://127.0.0.1:9001", state=ReplicaState.READY, ready=True, gpus=[0],
        generation=4, engine_args=["--max-num-seqs", "48", "--enable-chunked-prefill"],
        state_since=T0 - timedelta(minutes=5),
        engine=EngineSample(requests_running=3, requests_waiting=2, kv_cache_usage_ratio=0.42, preemptions_total=7,
                            generation_tokens_total=123456, generation_tokens_per_second=900.5,
                            requests_per_second=4.25, errors_per_second=0.5, preemptions_per_second=0.25,
                            ttft_p50_seconds=0.05, ttft_p95_seconds=0.09, ttft_p99_seconds=0.12,
                            itl_p50_seconds=0.011, itl_p95_seconds=0.018, itl_p99_seconds=0.021,
                            e2e_p99_seconds=3.5, window=window),
        process=ProcessSample(pid=4242, rss_bytes=1_800 * 1024**2, cpu_percent=55.5, gpu_memory_bytes=60 * 1024**3),
        canary_ok=False, canary_ttft_seconds=0.07, requests_in_flight_at_wedge=3, live_cap=32)


def declared(status: ReplicaStatus, name: str) -> Any:
    """What the table says a signal of ``status`` is: its source read, as its field's type."""
    d = DECLARED[name]
    if callable(d.source):
        value = d.source(status)
    else:
        part = status if d.source == "status" else getattr(status, d.source)
        value = getattr(part, d.wire or name)
    return float(value) if d.stored == "float" else value


def _stored(client: TestClient) -> tuple[Any, dict[str, Any]]:
    with session_scope(client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        [[(at, values)]] = series_of(session, kind="replica", since=T0 - timedelta(days=1)).values()
    return at, dict(values)


def test_every_signal_goes_from_the_wire_through_the_store_back_to_its_sample(client: TestClient) -> None:
    status = every_signal()
    assert client.post("/v1/agents/gpu-a/report", json=body(report(replicas=[status]))).status_code == 200
    at, values = _stored(client)
    assert set(values) == SIGNALS  # every signal was reported, so every one is stored
    sample = from_stored(at, values, full=True)
    for name in SIGNALS:
        assert getattr(sample, name) == declared(status, name), name
    assert isinstance(sample.rss_bytes, int) and isinstance(sample.canary_ok, bool) and sample.max_num_seqs == 48


def test_the_history_cache_keeps_the_cached_signals_and_the_api_serves_them_all(client: TestClient) -> None:
    status = every_signal()
    assert client.post("/v1/agents/gpu-a/report", json=body(report(replicas=[status]))).status_code == 200
    cache = SampleHistory(timedelta(minutes=5))
    with session_scope(client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        cache.refresh(session, T0 + timedelta(seconds=1))
    [cached] = cache.replica("gpu-a", "r0", T0 - timedelta(minutes=1))
    assert isinstance(cached, ReplicaSample)
    for name, d in DECLARED.items():
        assert getattr(cached, name) == (declared(status, name) if d.cached else None), name
    # The API answers the stored values under the same keys, typed by the table.
    [point] = client.get("/v1/replicas/gpu-a/r0/samples").json()
    assert point["values"] == _stored(client)[1] and point["resolution_seconds"] == 0


def test_a_minute_of_samples_folds_as_the_table_says(client: TestClient) -> None:
    first, second = every_signal(), every_signal().model_copy(update={"generation": 5, "canary_ok": True})
    for i, status in enumerate((first, second)):
        sent = report(sequence=i + 1, sent_at=T0 + timedelta(seconds=10 * i), replicas=[status])
        assert client.post("/v1/agents/gpu-a/report", json=body(sent)).status_code == 200
    with session_scope(client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        [rows] = series_of(session, kind="replica", since=T0 - timedelta(days=1)).values()
    [(_, folded)] = downsample(rows, 3600, ROLLUPS)
    assert set(folded) == {n for n, rule in ROLLUPS.items() if rule != "drop"}
    assert folded["generation"] == 5.0  # the last: an average of two generations is neither
    assert folded["canary_ok"] == 0.5  # the share of the minute it passed
    assert "window" not in folded


def test_openapi_documents_each_signal_of_a_replica_sample(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    answer = spec["paths"]["/v1/replicas/{node}/{name}/samples"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"]["items"]["$ref"].endswith("/ReplicaSampleOut")
    documented = spec["components"]["schemas"]["ReplicaValues"]["properties"]
    assert set(documented) == SIGNALS
    for name, d in DECLARED.items():
        assert d.description in documented[name]["description"] and documented[name]["x-unit"] == d.unit
