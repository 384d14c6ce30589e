"""Simulated GPU readings: the file contract, and utilisation, power and heat against an H200's measured figures.

Measured on an NVIDIA H200 (700 W limit): 77 W and 35 degC idle; under a saturating bf16 matmul 691 W with
``sw_power_cap`` and utilisation 100 %, 53 degC after 2 s and 58 degC after 10 s; back to 42 degC within 2 s of
the load stopping. The simulator's clock is whatever ``advance`` is told: no wall clock here.
"""

from __future__ import annotations

import json
from pathlib import Path

from enginesim.gpufile import SimulatedGpu, gpu_indices, read_readings, remove_readings, write_reading
from enginesim.profiles import H100_LLAMA_8B

KEYS = {"pid", "gpu_index", "uuid", "name", "updated_at", "memory_total_bytes", "memory_used_bytes",
        "utilization_ratio", "power_watts", "power_idle_watts", "power_limit_watts", "throttle_reasons",
        "temperature_celsius", "slowdown_temperature_celsius", "shutdown_temperature_celsius", "xid_events"}


def gpu() -> SimulatedGpu:
    return SimulatedGpu(profile=H100_LLAMA_8B, index=1, pid=4242, memory_utilization=0.9, hostname="host-a")


def test_reading_has_the_contract_keys_and_values() -> None:
    r = gpu().reading(1000.0)
    assert set(r) == KEYS
    assert r["uuid"] == "GPU-sim-host-a-1" and r["name"] == "NVIDIA H100 80GB HBM3 (simulated)"
    assert r["memory_used_bytes"] == int(0.9 * r["memory_total_bytes"])
    assert r["slowdown_temperature_celsius"] < r["shutdown_temperature_celsius"]


def run(g: SimulatedGpu, seconds: float, utilization: float, tick: float = 0.5) -> None:
    for _ in range(round(seconds / tick)):
        g.advance(tick, utilization)


def test_utilisation_saturates_with_the_running_batch() -> None:
    p = H100_LLAMA_8B
    curve = [p.utilization(n) for n in (0, 1, 2, 4, 8, 16, 32, 64, 256)]
    assert curve == sorted(curve) and curve[0] == 0.0
    assert p.utilization(1) < 0.3  # one request leaves most of the GPU idle
    assert 0.8 < p.utilization(8) < 0.9 and p.utilization(16) > 0.97 and p.utilization(256) > 0.999


def test_power_rises_from_idle_and_is_capped_at_the_limit_as_sw_power_cap() -> None:
    g = gpu()
    idle = g.reading(0)
    assert idle["power_watts"] == 77.0 and idle["throttle_reasons"] == [] and idle["power_idle_watts"] == 77.0
    g.advance(1.0, H100_LLAMA_8B.utilization(1))
    one = g.reading(0)
    assert 150 < one["power_watts"] < 300 and one["throttle_reasons"] == []
    g.advance(1.0, 1.0)
    full = g.reading(0)
    assert abs(full["power_watts"] - 691.0) <= 1.0 and full["power_limit_watts"] == 700.0
    assert full["throttle_reasons"] == ["sw_power_cap"]  # normal under full load: not a fault
    draws = []
    for u in (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0):
        g.advance(1.0, u)
        draws.append(g.reading(0)["power_watts"])
    assert draws == sorted(draws) and max(draws) <= 700.0


def test_temperature_follows_the_h200_measured_under_full_load_and_after() -> None:
    g = gpu()
    assert g.temperature == 35.0
    run(g, 2.0, 1.0)
    assert abs(g.temperature - 53.0) <= 1.5
    run(g, 8.0, 1.0)
    at_10s = g.temperature
    assert abs(at_10s - 58.0) <= 1.5
    run(g, 2.0, 0.0)
    after_2s = g.temperature
    assert 36.0 < after_2s <= 42.5  # most of the way back within 2 s ...
    run(g, 8.0, 0.0)
    assert after_2s - g.temperature < at_10s - after_2s  # ... then slower
    run(g, 60.0, 0.0)
    assert abs(g.temperature - 35.0) < 0.5
    assert g.reading(0)["temperature_celsius"] == round(g.temperature, 2)


def test_steady_state_and_tick_size() -> None:
    fine, coarse = gpu(), gpu()
    run(fine, 10.0, 0.7, tick=0.1)
    run(coarse, 10.0, 0.7, tick=1.0)
    assert abs(fine.temperature - coarse.temperature) < 1e-6  # exact lags: the file interval does not matter
    run(fine, 300.0, 1.0)
    assert abs(fine.temperature - H100_LLAMA_8B.temperature_busy_celsius) < 0.1
    assert fine.temperature < H100_LLAMA_8B.slowdown_temperature_celsius - 20  # full load is not hot


def test_hot_gpu_crosses_slowdown_quickly() -> None:
    g = gpu()
    g.hot = True
    for _ in range(5):
        g.advance(1.0, 0.0)
    assert g.temperature > H100_LLAMA_8B.slowdown_temperature_celsius


def test_several_xids_at_one_instant() -> None:
    g = gpu()
    g.add_xids([79, 45, 45], 5.0)
    assert g.reading(6.0)["xid_events"] == [{"code": 79, "at": 5.0}, {"code": 45, "at": 5.0},
                                            {"code": 45, "at": 5.0}]


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
