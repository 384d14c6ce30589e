"""The recorded backend replays a real H200 reading (taken by the GPU smoke test) exactly as NVML gave it."""

from __future__ import annotations

from pathlib import Path

from agent.gpu import open_backend

FIXTURE = Path(__file__).parent.parent / "fixtures" / "gpu" / "h200-reading.json"


def test_recorded_h200_reading_replays_thresholds_memory_and_processes(tmp_path: Path) -> None:
    backend = open_backend("recorded", sim_dir=tmp_path, recorded=FIXTURE)
    try:
        reading = backend.read()
    finally:
        backend.close()
    (gpu,) = reading.gpus
    assert gpu.name == "NVIDIA H200"
    # The H200's own thresholds as NVML reported them: the policy engine reads these rather than assuming 85 °C.
    assert gpu.slowdown_temperature_celsius == 89.0
    assert gpu.shutdown_temperature_celsius == 95.0
    assert gpu.memory_total_bytes == 150_754_820_096
    assert reading.process_memory == {453: 2_787_115_008}


def test_recorded_per_gpu_processes_feed_orphan_detection(tmp_path: Path) -> None:
    # Recorded on an H200 by the smoke test after the backend learned per-GPU process memory.
    from agent.orphans import OrphanWatch

    backend = open_backend("recorded", sim_dir=tmp_path, recorded=FIXTURE.with_name("h200-reading-per-gpu.json"))
    reading = backend.read()
    assert reading.gpu_processes == {0: {497: 2_787_115_008}}
    watch = OrphanWatch(describe=lambda pid: "recorded", in_engine=lambda pid, roots: pid in roots)
    assert watch.check(reading.gpu_processes, owned=[497], roots=set()) == []
    (orphan,) = watch.check(reading.gpu_processes, owned=[], roots=set())
    assert (orphan.pid, orphan.gpu, orphan.memory_bytes) == (497, 0, 2_787_115_008)
