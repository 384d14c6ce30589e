"""GPU smoke test: the agent's real NVML backend on a real NVIDIA GPU. Skipped where NVML cannot start.

On a GPU host: readings are sane, GPU memory that a process allocates is attributed to that process id, and
the XID event set is registered. With ``PITSTOP_GPU_RECORD=FILE`` it also writes one reading in the recorded
backend's format, which is how ``tests/fixtures/gpu/h200-reading.json`` was made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gpu.base import GpuBackendError

pytestmark = pytest.mark.gpu

ALLOC_GIB = 2


@pytest.fixture(scope="module")
def backend() -> Iterator[object]:
    from agent.gpu.nvml import NvmlGpuBackend

    try:
        nvml = NvmlGpuBackend()
    except GpuBackendError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    if not nvml.handles:
        pytest.skip("NVML started but sees no GPU")
    try:
        yield nvml
    finally:
        nvml.close()


def test_readings_are_sane(backend) -> None:  # type: ignore[no-untyped-def]
    reading = backend.read()
    assert reading.gpus
    for gpu in reading.gpus:
        print(gpu.model_dump_json())
        assert gpu.uuid.startswith("GPU-")
        assert gpu.temperature_celsius is not None and 10 <= gpu.temperature_celsius <= 100
        # The device reports its own slowdown threshold (an H200 says 89 °C); it is read, never assumed.
        assert gpu.slowdown_temperature_celsius is not None
        assert gpu.temperature_celsius < gpu.slowdown_temperature_celsius < 120
        assert gpu.memory_total_bytes is not None and gpu.memory_total_bytes > 8 * 2**30
        assert gpu.memory_used_bytes is not None and 0 <= gpu.memory_used_bytes <= gpu.memory_total_bytes
        assert gpu.power_watts is not None and gpu.power_watts > 0
        assert gpu.power_limit_watts is not None and gpu.power_watts <= gpu.power_limit_watts * 1.2
        assert gpu.utilization_ratio is not None and 0 <= gpu.utilization_ratio <= 1


def test_xid_event_set_is_registered(backend) -> None:  # type: ignore[no-untyped-def]
    assert backend.events is not None, "NVML refused the XID critical-error event set"
    # Draining an empty event set must not raise and must not invent events.
    before = [g.xid_events_total for g in backend.read().gpus]
    after = [g.xid_events_total for g in backend.read().gpus]
    assert after == before


ALLOCATOR = f"""
import sys, time, torch
x = torch.empty({ALLOC_GIB} * 2**30, dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
print("allocated", flush=True)
sys.stdin.read()
"""


def test_per_process_gpu_memory_is_attributed_to_the_allocating_pid(backend) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    child = subprocess.Popen([sys.executable, "-c", ALLOCATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "allocated"
        deadline = time.monotonic() + 20
        seen = 0
        while time.monotonic() < deadline:
            reading = backend.read()
            seen = reading.process_memory.get(child.pid, 0)
            if seen >= ALLOC_GIB * 2**30:
                break
            time.sleep(0.5)
        print(f"pid {child.pid}: {seen / 2**30:.2f} GiB; all: {reading.process_memory}")
        record = os.environ.get("PITSTOP_GPU_RECORD")
        if record:
            frame = {"gpus": [g.model_dump(mode="json") for g in reading.gpus],
                     "processes": {str(pid): b for pid, b in reading.process_memory.items()}}
            Path(record).write_text(json.dumps({"frames": [frame]}, indent=1) + "\n")
        assert seen >= ALLOC_GIB * 2**30, f"NVML did not attribute {ALLOC_GIB} GiB to pid {child.pid}"
    finally:
        child.kill()
        child.wait(timeout=30)
