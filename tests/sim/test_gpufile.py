"""Simulated GPU readings: the file contract and the thermal model."""

from __future__ import annotations

import json
from pathlib import Path

from enginesim.gpufile import SimulatedGpu, gpu_indices, read_readings, remove_readings, write_reading
from enginesim.profiles import H100_LLAMA_8B

KEYS = {"pid", "gpu_index", "uuid", "name", "updated_at", "memory_total_bytes", "memory_used_bytes",
        "utilization_ratio", "power_watts", "power_limit_watts", "temperature_celsius",
        "slowdown_temperature_celsius", "shutdown_temperature_celsius", "xid_events"}


def gpu() -> SimulatedGpu:
    return SimulatedGpu(profile=H100_LLAMA_8B, index=1, pid=4242, memory_utilization=0.9, hostname="host-a")


def test_reading_has_the_contract_keys_and_values() -> None:
    r = gpu().reading(1000.0)
    assert set(r) == KEYS
    assert r["uuid"] == "GPU-sim-host-a-1" and r["name"] == "NVIDIA H100 80GB HBM3 (simulated)"
    assert r["memory_used_bytes"] == int(0.9 * r["memory_total_bytes"])
    assert r["slowdown_temperature_celsius"] < r["shutdown_temperature_celsius"]


def test_temperature_lags_toward_load_over_minutes_and_cools_when_idle() -> None:
    g = gpu()
    idle = g.temperature
    g.advance(10.0, 1.0)
    after_10s = g.temperature
    for _ in range(60):
        g.advance(10.0, 1.0)
    steady = g.temperature
    assert idle < after_10s < idle + 0.2 * (steady - idle)  # minutes, not seconds
    assert abs(steady - H100_LLAMA_8B.temperature_busy_celsius) < 1.0
    assert g.reading(0)["power_watts"] > 500
    g.advance(120.0, 0.0)
    assert g.temperature < steady - 10


def test_hot_gpu_crosses_slowdown_quickly() -> None:
    g = gpu()
    g.hot = True
    for _ in range(5):
        g.advance(1.0, 0.0)
    assert g.temperature > H100_LLAMA_8B.slowdown_temperature_celsius


def test_files_are_written_whole_and_removed(tmp_path: Path) -> None:
    g = gpu()
    g.add_xid(79, 5.0)
    g.leak(10 * 2**20)
    path = write_reading(tmp_path, g.reading(2.0))
    assert path.name == "gpu1-4242.json"
    assert json.loads(path.read_text())["xid_events"] == [{"code": 79, "at": 5.0}]
    assert [r["pid"] for r in read_readings(tmp_path)] == [4242]
    assert not list(tmp_path.glob(".*.tmp"))
    remove_readings(tmp_path, [g])
    assert read_readings(tmp_path) == []


def test_cuda_visible_devices() -> None:
    assert gpu_indices(None) == [0] and gpu_indices("") == [0]
    assert gpu_indices("2,5") == [2, 5]
    assert gpu_indices("GPU-aaa,GPU-bbb") == [0, 1]
