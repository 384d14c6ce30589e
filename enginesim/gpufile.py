"""Simulated GPU readings, published as one JSON file per GPU for the agent's simulated GPU backend.

File contract (version 1). Every simulator process writes, about once a second and atomically (write a
temporary file in the same directory, then ``os.replace``), one file per GPU index it runs on, into the GPU
directory (``--sim-gpu-dir``, env ``PITSTOP_SIM_GPU_DIR``, default ``./.pitstop/simgpu``). Indices come from
``CUDA_VISIBLE_DEVICES`` (default ``"0"``; an entry that is not an integer counts by its position). The file
is named ``gpu<index>-<pid>.json`` and removed when the process exits cleanly; a file whose process is gone
is stale. Its one JSON object has these keys:

- ``pid`` (int): the simulator process; ``gpu_index`` (int); ``uuid`` (str, ``GPU-sim-<hostname>-<index>``,
  stable across restarts); ``name`` (str, e.g. ``NVIDIA H100 80GB HBM3 (simulated)``);
- ``updated_at`` (float, unix seconds of this reading);
- ``memory_total_bytes`` (int); ``memory_used_bytes`` (int): this process's use, the
  ``--gpu-memory-utilization`` share of the total taken at start plus any leak
  (``--fault-leak-gpu-mb-per-min``);
- ``utilization_ratio`` (float 0-1): the share of the last interval the engine spent in steps;
- ``power_watts``, ``power_limit_watts`` (float): power follows utilisation between idle and busy draw;
- ``temperature_celsius`` (float): first-order lag toward a steady state set by utilisation (time constant
  two minutes), cooling toward idle when the engine idles; ``slowdown_temperature_celsius`` and
  ``shutdown_temperature_celsius`` (float): the thresholds NVML would report;
- ``xid_events`` (list of ``{"code": int, "at": float}``): simulated XID errors so far (``--fault-xid-after``).

``--fault-hot-gpu-after S`` makes the GPU run hot after S seconds: its steady state moves 5 degrees past the
slowdown threshold and the time constant drops to one second, so tests see it cross within seconds.
"""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginesim.profiles import SpeedProfile

NORMAL_TIME_CONSTANT_S = 120.0
HOT_TIME_CONSTANT_S = 1.0
HOT_MARGIN_CELSIUS = 5.0


def gpu_indices(cuda_visible_devices: str | None) -> list[int]:
    """GPU indices named by ``CUDA_VISIBLE_DEVICES``; ``[0]`` when unset or empty."""
    if not cuda_visible_devices or not cuda_visible_devices.strip():
        return [0]
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    return [int(e) if e.isdigit() else pos for pos, e in enumerate(entries)]


@dataclass
class SimulatedGpu:
    """One simulated GPU as this process sees it: memory, heat, power, XIDs."""

    profile: SpeedProfile
    index: int
    pid: int
    memory_utilization: float
    hostname: str = field(default_factory=socket.gethostname)
    temperature: float = 0.0
    utilization: float = 0.0
    leaked_bytes: int = 0
    hot: bool = False
    xid_events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.temperature = self.temperature or self.profile.temperature_idle_celsius

    def advance(self, dt: float, utilization: float) -> None:
        """Move ``dt`` seconds forward with the engine busy ``utilization`` of that time."""
        p = self.profile
        self.utilization = min(1.0, max(0.0, utilization))
        target = p.temperature_idle_celsius + (p.temperature_busy_celsius - p.temperature_idle_celsius) * (
            self.utilization)
        tau = NORMAL_TIME_CONSTANT_S
        if self.hot:
            target, tau = p.slowdown_temperature_celsius + HOT_MARGIN_CELSIUS, HOT_TIME_CONSTANT_S
        self.temperature += (target - self.temperature) * (1.0 - math.exp(-max(0.0, dt) / tau))

    def leak(self, nbytes: int) -> None:
        self.leaked_bytes += nbytes

    def add_xid(self, code: int, at: float) -> None:
        self.xid_events.append({"code": code, "at": at})

    def reading(self, now: float) -> dict[str, Any]:
        """The file's JSON object at unix time ``now``."""
        p = self.profile
        total = p.gpu_memory_bytes
        used = min(total, int(total * self.memory_utilization) + self.leaked_bytes)
        power = p.power_idle_watts + (p.power_busy_watts - p.power_idle_watts) * self.utilization
        return {
            "pid": self.pid,
            "gpu_index": self.index,
            "uuid": f"GPU-sim-{self.hostname}-{self.index}",
            "name": p.gpu_name,
            "updated_at": now,
            "memory_total_bytes": total,
            "memory_used_bytes": used,
            "utilization_ratio": round(self.utilization, 4),
            "power_watts": round(power, 1),
            "power_limit_watts": p.power_limit_watts,
            "temperature_celsius": round(self.temperature, 2),
            "slowdown_temperature_celsius": p.slowdown_temperature_celsius,
            "shutdown_temperature_celsius": p.shutdown_temperature_celsius,
            "xid_events": list(self.xid_events),
        }


def reading_path(directory: Path, index: int, pid: int) -> Path:
    return directory / f"gpu{index}-{pid}.json"


def write_reading(directory: Path, reading: dict[str, Any]) -> Path:
    """Write one reading atomically; returns the file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = reading_path(directory, int(reading["gpu_index"]), int(reading["pid"]))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(reading))
    os.replace(tmp, path)
    return path


def read_readings(directory: Path) -> list[dict[str, Any]]:
    """Every reading in ``directory`` (the agent-side view; stale files included)."""
    out = []
    for path in sorted(directory.glob("gpu*-*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # removed or replaced between listing and reading
    return out


def remove_readings(directory: Path, gpus: list[SimulatedGpu]) -> None:
    for gpu in gpus:
        reading_path(directory, gpu.index, gpu.pid).unlink(missing_ok=True)
