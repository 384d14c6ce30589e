"""The NVML backend on a real NVIDIA GPU (skipped where NVML does not initialise)."""

from __future__ import annotations

import pytest

from agent.gpu import GpuBackendError
from agent.gpu.nvml import NvmlGpuBackend, decode_reasons

pytestmark = pytest.mark.gpu


@pytest.fixture
def nvml() -> NvmlGpuBackend:
    try:
        return NvmlGpuBackend()
    except GpuBackendError as exc:
        pytest.skip(f"no NVML here: {exc}")


def test_reads_every_gpu_with_its_own_thresholds(nvml: NvmlGpuBackend) -> None:
    try:
        first, second = nvml.read(), nvml.read()
    finally:
        nvml.close()
    assert first.gpus, "NVML initialised but listed no GPU"
    for gpu in first.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.name
        assert gpu.temperature_celsius is not None and 0 < gpu.temperature_celsius < 120
        # Read from the device, never hard-coded (an H200 says 89 °C, DESIGN.md).
        assert gpu.slowdown_temperature_celsius is not None and gpu.slowdown_temperature_celsius > 50
        assert gpu.memory_total_bytes is not None and gpu.memory_total_bytes > 1024**3
        assert gpu.memory_used_bytes is not None and gpu.memory_used_bytes <= gpu.memory_total_bytes
        assert gpu.power_limit_watts is not None and gpu.power_limit_watts > 0
        assert gpu.utilization_ratio is not None and 0 <= gpu.utilization_ratio <= 1
    # XID totals are counts: they never go down between reads.
    for a, b in zip(first.gpus, second.gpus, strict=True):
        assert b.xid_events_total >= a.xid_events_total


def test_clock_event_reasons_decode() -> None:
    assert decode_reasons(0x40 | 0x04) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0) == []


# A parent (the "API server") whose child (the "EngineCore") holds 1 GiB on the GPU.
ENGINE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import sys, time, torch
x = torch.empty(1024**3, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("allocated", flush=True)
time.sleep(60)
'''], stdout=sys.stdout)
child.wait()
"""


def test_per_process_gpu_memory_maps_to_the_replica_tree(nvml: NvmlGpuBackend) -> None:
    pytest.importorskip("torch")
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from agent.process_tree import ProcessTreeSampler

    proc = subprocess.Popen([sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"allocated"
        deadline = time.monotonic() + 10
        sample = ProcessTreeSampler().sample(proc.pid, nvml.read().process_memory)
        while (sample.gpu_memory_bytes or 0) < 1024**3 and time.monotonic() < deadline:
            time.sleep(0.2)
            sample = ProcessTreeSampler().sample(proc.pid, nvml.read().process_memory)
        print("process tree sample:", sample, "nvml per-pid:", nvml.read().process_memory)
        assert sample.num_processes == 2
        assert (sample.gpu_memory_bytes or 0) >= 1024**3  # the child's allocation, credited to the parent's tree
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        nvml.close()
