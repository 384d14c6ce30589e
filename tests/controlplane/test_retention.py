"""Old samples fold into one-minute averages; samples past retention disappear."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from controlplane.retention import RetentionLoop, downsample
from tests.controlplane.fixtures import T0, body, replica, report


def test_downsample_averages_per_bucket_and_skips_missing_fields() -> None:
    points: list[tuple[datetime, dict[str, Any]]] = [(T0 + timedelta(seconds=5), {"ttft": 0.1, "rss": 100}),
              (T0 + timedelta(seconds=35), {"ttft": 0.3}),
              (T0 + timedelta(seconds=65), {"ttft": 0.5, "rss": 300, "label": "x"})]
    assert downsample(points, 60) == [(T0, {"ttft": 0.2, "rss": 100.0}),
                                      (T0 + timedelta(seconds=60), {"ttft": 0.5, "rss": 300.0})]


def test_downsample_keeps_only_numbers_of_a_gpu_sample() -> None:
    # A GPU sample's XID codes and throttle reasons are lists for the detectors; a minute's average has neither.
    points = [(T0, {"temperature_celsius": 60.0, "xids": [79, 45], "throttle_reasons": ["sw_power_cap"]}),
              (T0 + timedelta(seconds=5), {"temperature_celsius": 62.0})]
    assert downsample(points, 60) == [(T0, {"temperature_celsius": 61.0})]


def test_retention_downsamples_then_deletes(app, client: TestClient, config, clock) -> None:
    for i in range(6):  # one report every 20 s for two minutes
        sent = T0 + timedelta(seconds=20 * i)
        client.post("/v1/agents/gpu-a/report",
                    json=body(report(sequence=i + 1, sent_at=sent, replicas=[replica("r0", ttft=0.1 * (i + 1))])))
    cfg = config.model_copy(update={"sample_full_resolution_seconds": 600, "sample_retention_seconds": 3600})
    loop = RetentionLoop(app.state.pitstop.sessions, clock=clock, config=cfg)
    series = lambda: client.get("/v1/replicas/gpu-a/r0/samples").json()  # noqa: E731

    clock.now = T0 + timedelta(seconds=300)  # everything still within full resolution
    assert loop.run_once().downsampled == 0 and len(series()) == 6

    clock.now = T0 + timedelta(seconds=900)
    result = loop.run_once()
    assert (result.downsampled, result.buckets) == (6, 2)  # six reports' rows fold into two minutes' rows
    points = series()
    assert [p["resolution_seconds"] for p in points] == [60, 60]
    assert [round(p["values"]["ttft_p99_seconds"], 3) for p in points] == [0.2, 0.5]

    clock.now = T0 + timedelta(seconds=3700)
    assert loop.run_once().deleted == 2 and series() == []


def test_rows_of_the_earlier_format_fold_with_the_new_ones(app, client: TestClient, config, clock) -> None:
    from sqlalchemy import select, update

    from controlplane.store.db import session_scope
    from controlplane.store.models import NodeSamples
    from controlplane.store.packing import FORMAT, FORMAT_1, pack_format_1, unpack

    for i in range(6):
        sent = T0 + timedelta(seconds=20 * i)
        client.post("/v1/agents/gpu-a/report",
                    json=body(report(sequence=i + 1, sent_at=sent, replicas=[replica("r0", ttft=0.1 * (i + 1))])))
    with session_scope(app.state.pitstop.sessions) as session:  # the first minute as an upgraded store holds it
        for row_id, data in session.execute(select(NodeSamples.id, NodeSamples.data).order_by(NodeSamples.at)
                                            .limit(3)).all():
            session.execute(update(NodeSamples).where(NodeSamples.id == row_id)
                            .values(data=pack_format_1(unpack(data))))
    with session_scope(app.state.pitstop.sessions) as session:
        assert [data[0] for data in session.scalars(select(NodeSamples.data).order_by(NodeSamples.at))] == [
            FORMAT_1] * 3 + [FORMAT] * 3
    cfg = config.model_copy(update={"sample_full_resolution_seconds": 600, "sample_retention_seconds": 3600})
    clock.now = T0 + timedelta(seconds=900)
    result = RetentionLoop(app.state.pitstop.sessions, clock=clock, config=cfg).run_once()
    assert (result.downsampled, result.buckets) == (6, 2)
    points = client.get("/v1/replicas/gpu-a/r0/samples").json()
    assert [round(p["values"]["ttft_p99_seconds"], 3) for p in points] == [0.2, 0.5]
