"""Packed samples: a node's readings at one instant come back exactly as they went in, or fail loudly."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

from controlplane.fleet.ingest import GPU_SERIES
from controlplane.policy.signals import SIGNALS
from controlplane.remediation.history import SampleHistory
from controlplane.store import packing
from controlplane.store.db import session_scope
from controlplane.store.models import NodeSamples
from controlplane.store.packing import PackError, pack, unpack
from tests.controlplane.fixtures import T0, body, gpu, replica, report


def test_every_value_comes_back_exactly_in_order() -> None:
    items = [("replica", "r0", {"generation_tokens_total": 2.0**53 - 1, "ttft_p99_seconds": 0.123456789012345,
                                "flags_key": 1234567.0}),
             ("replica", "r1", {}),
             ("gpu", "0", {"temperature_celsius": 61.0, "xids": [79, 45], "throttle_reasons": ["sw_power_cap"],
                           "cordoned": True}),
             ("gpu", "1", {"power_watts": 3, "memory_used_bytes": None})]
    assert unpack(pack(items)) == [
        items[0], ("replica", "r1", {}), items[2],
        ("gpu", "1", {"power_watts": 3.0})]  # ints come back as floats; a None is absent, as unreported


def test_the_preset_names_cover_every_signal_so_names_cost_almost_nothing() -> None:
    names = packing._NAMES.decode()
    assert [n for n in [*SIGNALS, *GPU_SERIES] if f'"{n}"' not in names] == []


@pytest.mark.parametrize("blob", [b"", b"\x09abc", bytes([packing.FORMAT]) + b"not zlib",
                                  pack([("replica", "r0", {"a": 1.0})])[:-3]])
def test_a_value_that_cannot_be_read_is_refused_not_misread(blob: bytes) -> None:
    with pytest.raises(PackError):
        unpack(blob)


def test_a_corrupt_row_is_skipped_and_logged_and_the_rest_of_the_fleet_is_read(
        client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    for i in range(2):
        sent = report(sequence=i + 1, sent_at=T0 + timedelta(seconds=5 * i), gpus=[gpu(0)],
                      replicas=[replica("r0", ttft=0.1 * (i + 1))])
        assert client.post("/v1/agents/gpu-a/report", json=body(sent)).status_code == 200
    sessions = client.app.state.pitstop.sessions  # type: ignore[attr-defined]
    with session_scope(sessions) as session:
        session.execute(insert(NodeSamples).values(node="gpu-a", at=T0 + timedelta(seconds=7), resolution_seconds=0,
                                                   data=b"\x01garbage"))
    history = SampleHistory(timedelta(minutes=5))
    with caplog.at_level(logging.ERROR), session_scope(sessions) as session:
        assert history.refresh(session, T0 + timedelta(seconds=10)) == 4  # two reports: a replica and a GPU each
    assert [s.ttft_p99_seconds for s in history.replica("gpu-a", "r0", T0)] == [0.1, 0.2]
    assert "cannot be read" in caplog.text
    series = client.get("/v1/replicas/gpu-a/r0/samples").json()
    assert [round(p["values"]["ttft_p99_seconds"], 3) for p in series] == [0.1, 0.2]
