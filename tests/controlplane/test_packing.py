"""Packed samples: a node's readings at one instant come back exactly as they went in, or fail loudly."""

from __future__ import annotations

import logging
import math
import random
import zlib
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


def test_whole_numbers_and_every_float_come_back_exactly() -> None:
    edge = {"zero": 0.0, "minus_zero": -0.0, "negative": -5.0, "byte": 255.0, "short": 256.0, "word": 2.0**32 - 1,
            "past_exact_floats": 2.0**53 + 2, "past_64_bits": 2.0**64, "fraction": 0.1, "tiny": 5e-324,
            "infinite": math.inf, "not_a_number": math.nan}
    (_, _, back), = unpack(pack([("replica", "r0", edge)]))
    assert set(back) == set(edge)
    for name, value in edge.items():
        assert type(back[name]) is float, name
        if math.isnan(value):
            assert math.isnan(back[name])
        else:
            assert back[name] == value and math.copysign(1.0, back[name]) == math.copysign(1.0, value), name


def test_whole_numbers_are_stored_in_the_bytes_they_need() -> None:
    rng = random.Random(1)
    counts = {f"count_{i}": float(rng.randrange(256)) for i in range(200)}  # as 8-byte floats: 3 to 4 bytes each
    names_alone = len(pack([("replica", "r0", dict.fromkeys(counts, 0.0))]))
    assert len(pack([("replica", "r0", counts)])) - names_alone < 2 * len(counts)


# A node's samples as the format before this one (every number an 8-byte float) stored them.
_FORMAT_1_ROW = bytes.fromhex(
    "0178bb2c9e74b78b26aa20c35d3c616479d4fc819aec61491d257e8c480857e4f0420a04734b9057182080c3e13f18d83beb7d7333bf"
    "3b6bbf3d58b8c1cf014c77143b00009c305345")


def test_rows_stored_in_the_earlier_format_are_still_read() -> None:
    assert unpack(_FORMAT_1_ROW) == [
        ("replica", "r0", {"requests_running": 3.0, "generation_tokens_total": 2.0**53 - 1,
                           "ttft_p99_seconds": 0.123456789012345,
                           "window": {"seconds": 5.0, "ttft": {"counts": [0.0, 2.0]}}}),
        ("gpu", "0", {"temperature_celsius": 61.0, "power_watts": 312.5, "xids": [79]})]


@pytest.mark.parametrize("preset", [packing._NAMES, packing._DICTIONARY_2])
def test_the_preset_names_cover_every_signal_so_names_cost_almost_nothing(preset: bytes) -> None:
    names = preset.decode()
    assert [n for n in [*SIGNALS, *GPU_SERIES] if f'"{n}"' not in names] == []


def _stored(body: bytes) -> bytes:
    packer = zlib.compressobj(9, zdict=packing._DICTIONARY_2)
    return bytes([packing.FORMAT]) + packer.compress(body) + packer.flush()


@pytest.mark.parametrize("blob", [
    b"", b"\x09abc", bytes([packing.FORMAT]) + b"not zlib", pack([("replica", "r0", {"a": 1.0})])[:-3],
    _stored(b'[["replica","r0",["a"],[]]]\0x\0\x01'),  # a width no format has
    _stored(b'[["replica","r0",[],["a"]]]\0\0\x01\x02\x03'),  # a float cut short
    _stored(b'[["replica","r0",["a","b"],[]]]\0B\0\x01'),  # more names than numbers
    _stored(b'[["replica","r0",["a"],[]]]\0BB\0\x01\x02'),  # more numbers than names
    _stored(b'{"not":"a list"}\0\0'),
])
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
