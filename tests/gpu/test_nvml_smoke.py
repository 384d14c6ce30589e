"""GPU smoke test: the agent's real NVML backend on a real NVIDIA GPU. Skipped where NVML cannot start.

On a GPU host: readings are sane (the device's own thresholds, counts that never go down), the XID event set
is registered, and GPU memory that an engine's child allocates is attributed to that pid, on its GPU, and so
to the replica's process tree; the same process, seen from an agent that did not start it, is an orphan.
With ``PITSTOP_GPU_RECORD=FILE`` it also writes one reading in the recorded backend's format, which is how
``tests/fixtures/gpu/h200-reading.json`` was made.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agent.gpu.base import GpuBackendError, GpuReading
from agent.gpu.throttle import KNOWN_REASONS
from agent.orphans import OrphanWatch
from agent.process_tree import ProcessTreeSampler
from agent.wire import MAX_XIDS

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
    first, second = backend.read(), backend.read()
    assert first.gpus
    for gpu in first.gpus:
        print(gpu.model_dump_json())
        assert gpu.uuid.startswith("GPU-") and gpu.name
        assert gpu.temperature_celsius is not None and 10 <= gpu.temperature_celsius <= 100
        # The device reports its own slowdown threshold (an H200 says 89 °C); it is read, never assumed.
        assert gpu.slowdown_temperature_celsius is not None
        assert gpu.temperature_celsius < gpu.slowdown_temperature_celsius < 120
        assert gpu.memory_total_bytes is not None and gpu.memory_total_bytes > 8 * 2**30
        assert gpu.memory_used_bytes is not None and 0 <= gpu.memory_used_bytes <= gpu.memory_total_bytes
        assert gpu.power_watts is not None and gpu.power_watts > 0
        assert gpu.power_limit_watts is not None and gpu.power_watts <= gpu.power_limit_watts * 1.2
        assert gpu.utilization_ratio is not None and 0 <= gpu.utilization_ratio <= 1
        # Reasons carry the names the exporter labels (every one known), and a read's XIDs fit the wire.
        assert set(gpu.throttle_reasons) <= set(KNOWN_REASONS)
        assert len(gpu.xids) <= MAX_XIDS and gpu.xid_events_total >= len(gpu.xids)
    # XID totals are counts (dcgm-exporter#500: no sticky last value): they never go down between reads.
    for a, b in zip(first.gpus, second.gpus, strict=True):
        assert b.xid_events_total >= a.xid_events_total


def test_xid_event_set_is_registered(backend) -> None:  # type: ignore[no-untyped-def]
    assert backend.events is not None, "NVML refused the XID critical-error event set"
    # Draining an empty event set must not raise and must not invent events.
    before = [g.xid_events_total for g in backend.read().gpus]
    after = backend.read().gpus
    assert [g.xid_events_total for g in after] == before
    assert all(g.xids == [] for g in after)


# A parent (the "API server") whose child (the "EngineCore") holds ALLOC_GIB on GPU 0, as vLLM's do.
ENGINE = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import sys, time, torch
x = torch.empty({ALLOC_GIB} * 2**30, dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
print("allocated", flush=True)
time.sleep(120)
'''], stdout=sys.stdout)
child.wait()
"""


def _record(path: str, reading: GpuReading) -> None:
    frame = {"gpus": [g.model_dump(mode="json") for g in reading.gpus],
             "processes": {str(pid): b for pid, b in reading.process_memory.items()},
             "gpu_processes": {str(i): {str(pid): b for pid, b in procs.items()}
                               for i, procs in reading.gpu_processes.items()}}
    Path(path).write_text(json.dumps({"frames": [frame]}, indent=1) + "\n")


def test_gpu_memory_is_attributed_to_the_pid_its_gpu_and_the_replica_tree(backend) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"allocated"
        child = next(c.pid for c in psutil.Process(proc.pid).children())
        deadline = time.monotonic() + 20
        reading = backend.read()
        while reading.process_memory.get(child, 0) < ALLOC_GIB * 2**30 and time.monotonic() < deadline:
            time.sleep(0.5)
            reading = backend.read()
        print(f"child {child}: {reading.process_memory.get(child, 0) / 2**30:.2f} GiB; "
              f"per GPU: {reading.gpu_processes}")
        record = os.environ.get("PITSTOP_GPU_RECORD")
        if record:
            _record(record, reading)
        assert reading.process_memory.get(child, 0) >= ALLOC_GIB * 2**30, "NVML did not attribute the memory"
        assert reading.gpu_processes[0].get(child, 0) >= ALLOC_GIB * 2**30  # on the GPU it allocated on
        sample = ProcessTreeSampler().sample(proc.pid, reading.process_memory)
        assert sample.num_processes == 2
        assert (sample.gpu_memory_bytes or 0) >= ALLOC_GIB * 2**30  # the child's memory is the replica's
        # An agent whose replica is this tree owns it; one that did not start it reports an orphan.
        assert OrphanWatch().check(reading.gpu_processes, owned=[], roots={proc.pid}) == []
        orphans = OrphanWatch().check(reading.gpu_processes, owned=[], roots=set())
        assert child in [o.pid for o in orphans if o.gpu == 0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
