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
