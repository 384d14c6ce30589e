"""GPU backends: the simulator's files aggregated per GPU, recorded replays, and the auto choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.gpu import GpuBackendError, open_backend
from agent.gpu.recorded import RecordedGpuBackend
from agent.gpu.sim import SimGpuBackend

GIB = 1024**3


def write(directory: Path, index: int, pid: int, **fields: object) -> None:
    body = {"pid": pid, "gpu_index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H200", "updated_at": 1.0,
            "memory_total_bytes": 141 * GIB, "memory_used_bytes": 0, "utilization_ratio": 0.0,
            "power_watts": 0.0, "power_limit_watts": 700.0, "temperature_celsius": 40.0,
            "slowdown_temperature_celsius": 89.0, "shutdown_temperature_celsius": 92.0, "xid_events": []}
    body.update(fields)
    (directory / f"gpu{index}-{pid}.json").write_text(json.dumps(body))


def test_files_of_live_pids_are_aggregated_per_gpu(tmp_path: Path) -> None:
    write(tmp_path, 0, 101, memory_used_bytes=30 * GIB, utilization_ratio=0.4, power_watts=200.0,
          temperature_celsius=60.0)
    write(tmp_path, 0, 102, memory_used_bytes=20 * GIB, utilization_ratio=0.9, power_watts=300.0,
          temperature_celsius=71.0, xid_events=[{"code": 79, "at": 5.0}])
    write(tmp_path, 0, 999, memory_used_bytes=50 * GIB, power_watts=500.0)  # dead process: ignored
    write(tmp_path, 1, 103, memory_used_bytes=10 * GIB, power_watts=650.0)
    (tmp_path / "notes.txt").write_text("not a reading")
    backend = SimGpuBackend(tmp_path, count=3, pid_alive=lambda pid: pid != 999)

    reading = backend.read()
    gpu0, gpu1, gpu2 = reading.gpus
    assert gpu0.memory_used_bytes == 50 * GIB
    assert gpu0.utilization_ratio == 0.9 and gpu0.temperature_celsius == 71.0
    assert gpu0.power_watts == 77.0 + 500.0  # an idle H200's 77 W, plus each file's draw (no idle of its own)
    assert gpu0.xid_events_total == 1 and gpu0.last_xid == 79 and gpu0.xids == [79]
    assert gpu0.throttle_reasons == []
    assert gpu1.power_watts == 700.0 and gpu1.throttle_reasons == ["sw_power_cap"]  # idle + 650 W, capped
    assert gpu2.memory_used_bytes == 0 and gpu2.utilization_ratio == 0.0  # no file: an idle GPU
    assert gpu2.slowdown_temperature_celsius == 89.0
    assert reading.process_memory == {101: 30 * GIB, 102: 20 * GIB, 103: 10 * GIB}


def test_xid_count_never_goes_down_when_the_process_goes_away(tmp_path: Path) -> None:
    alive = {7}
    backend = SimGpuBackend(tmp_path, pid_alive=lambda pid: pid in alive)
    write(tmp_path, 0, 7, xid_events=[{"code": 48, "at": 1.0}, {"code": 79, "at": 2.0}])
    assert backend.read().gpus[0].xid_events_total == 2
    assert backend.read().gpus[0].xid_events_total == 2  # the same events are not counted twice
    alive.clear()
    assert backend.read().gpus[0].xid_events_total == 2


def test_each_read_carries_the_codes_first_seen_by_it_several_in_one_interval(tmp_path: Path) -> None:
    backend = SimGpuBackend(tmp_path, pid_alive=lambda pid: True)
    write(tmp_path, 0, 7, xid_events=[{"code": 79, "at": 2.0}, {"code": 48, "at": 1.0}])
    first = backend.read().gpus[0]
    assert first.xids == [48, 79] and first.last_xid == 79  # oldest first
    write(tmp_path, 0, 7, xid_events=[{"code": 79, "at": 2.0}, {"code": 48, "at": 1.0}, {"code": 45, "at": 3.0},
                                      {"code": 45, "at": 3.0}])  # the simulator appends; two at one instant
    again = backend.read().gpus[0]
    assert again.xids == [45, 45] and again.xid_events_total == 4
    assert backend.read().gpus[0].xids == []


def test_processes_sharing_a_gpu_share_its_idle_draw_and_cap_together(tmp_path: Path) -> None:
    # Files of the simulator carry their own idle draw: the GPU's idle counts once, the rest adds up.
    write(tmp_path, 0, 1, power_watts=400.0, power_idle_watts=77.0, throttle_reasons=[])
    write(tmp_path, 0, 2, power_watts=300.0, power_idle_watts=77.0, throttle_reasons=[])
    write(tmp_path, 1, 3, power_watts=691.0, power_idle_watts=77.0, throttle_reasons=["sw_power_cap"])
    write(tmp_path, 2, 4, power_watts=77.0, power_idle_watts=77.0, temperature_celsius=90.0)
    gpu0, gpu1, gpu2 = SimGpuBackend(tmp_path, count=3, pid_alive=lambda pid: True).read().gpus
    assert gpu0.power_watts == 77.0 + 323.0 + 223.0 and gpu0.throttle_reasons == []
    assert gpu1.power_watts == 691.0 and gpu1.throttle_reasons == ["sw_power_cap"]  # capped by the simulator
    assert gpu2.power_watts == 77.0 and gpu2.throttle_reasons == ["hw_thermal_slowdown"]  # at its slowdown


def test_half_written_file_is_skipped_and_missing_dir_reads_idle(tmp_path: Path) -> None:
    (tmp_path / "gpu0-5.json").write_text('{"pid": 5, "memory_us')
    assert SimGpuBackend(tmp_path, pid_alive=lambda p: True).read().gpus[0].memory_used_bytes == 0
    assert len(SimGpuBackend(tmp_path / "absent", count=2).read().gpus) == 2


def test_recorded_backend_replays_frames_then_repeats_the_last(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    frames = [{"gpus": [{"index": 0, "uuid": "GPU-a", "name": "H200", "temperature_celsius": t}],
               "processes": {"42": 1000}} for t in (50.0, 60.0)]
    path.write_text(json.dumps({"frames": frames}))
    backend = RecordedGpuBackend(path)
    temps = [backend.read().gpus[0].temperature_celsius for _ in range(3)]
    assert temps == [50.0, 60.0, 60.0]
    assert backend.read().process_memory == {42: 1000}


def test_bad_recording_and_auto_fallback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"frames": [{"gpus": [{"index": -1}]}]}')
    with pytest.raises(GpuBackendError, match="frame 0"):
        RecordedGpuBackend(bad)
    with pytest.raises(GpuBackendError):
        open_backend("recorded", tmp_path)
    backend = open_backend("auto", tmp_path, 2)
    assert backend.name in ("nvml", "sim")
    backend.close()


def test_clock_event_reasons_decode() -> None:
    from agent.gpu.nvml import decode_reasons

    assert decode_reasons(0x40 | 0x04) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0) == []
