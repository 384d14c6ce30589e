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
- ``utilization_ratio`` (float 0-1): how busy the engine kept the GPU over the last interval: each step counts
  its duration times ``1 - exp(-batch / scale)`` (``SpeedProfile.utilization``), so one request leaves most of
  the GPU idle and a full batch saturates it;
- ``power_watts`` (float): the board's draw, idle included, rising with utilisation from ``power_idle_watts``
  (float) towards what full load would ask for, held at ``POWER_CAP_HOLD`` of ``power_limit_watts`` (float)
  once it reaches it (``throttle_reasons`` then lists ``sw_power_cap``);
- ``throttle_reasons`` (list of str): the NVML clocks-event reasons active (``agent.gpu.throttle``'s names);
- ``temperature_celsius`` (float): idle plus two first-order lags towards a steady state set by the power
  drawn: the die's (time constant 0.3 s, most of the rise) and the heatsink's (10 s), so a GPU warms within
  seconds of load, falls most of the way back within seconds of it stopping, and the rest more slowly;
  ``slowdown_temperature_celsius`` and ``shutdown_temperature_celsius`` (float): the thresholds NVML would
  report;
- ``xid_events`` (list of ``{"code": int, "at": float}``): simulated XID errors so far, oldest first, several
  at one instant when several codes are injected at once (``--fault-xid-after``, ``--fault-xid-code 79,45``).

``--fault-hot-gpu-after S`` makes the GPU run hot after S seconds: its steady state moves 5 degrees past the
slowdown threshold and both time constants drop to one second, so tests see it cross within seconds.
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

HOT_TIME_CONSTANT_S = 1.0
HOT_MARGIN_CELSIUS = 5.0
# What a power-capped GPU draws against its limit: an H200 under a saturating matmul held 691 W of 700 W.
POWER_CAP_HOLD = 691.0 / 700.0
POWER_CAP = "sw_power_cap"


def power_draw(profile: SpeedProfile, utilization: float) -> tuple[float, bool]:
    """The board's draw at ``utilization`` and whether the power cap holds it: linear from idle towards what
    full load asks for, held at ``POWER_CAP_HOLD`` of the limit once it gets there."""
    demand = profile.power_idle_watts + (profile.power_busy_watts - profile.power_idle_watts) * utilization
    hold = profile.power_limit_watts * POWER_CAP_HOLD
    return (hold, True) if demand >= hold else (demand, False)


def _lag(value: float, target: float, dt: float, tau: float) -> float:
    """A first-order lag's value ``dt`` seconds on, towards a target held over that time."""
    return value + (target - value) * (1.0 - math.exp(-max(0.0, dt) / tau))


def gpu_indices(cuda_visible_devices: str | None) -> list[int]:
    """GPU indices named by ``CUDA_VISIBLE_DEVICES``; ``[0]`` when unset or empty."""
    if not cuda_visible_devices or not cuda_visible_devices.strip():
        return [0]
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    return [int(e) if e.isdigit() else pos for pos, e in enumerate(entries)]


@dataclass
class SimulatedGpu:
    """One simulated GPU as this process sees it: memory, heat, power, XIDs. Time is what ``advance`` is told."""

    profile: SpeedProfile
    index: int
    pid: int
    memory_utilization: float
    hostname: str = field(default_factory=socket.gethostname)
    utilization: float = 0.0
    # Degrees above idle held by the die (fast) and the heatsink (slow).
    die_rise: float = 0.0
    sink_rise: float = 0.0
    leaked_bytes: int = 0
    hot: bool = False
    xid_events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def temperature(self) -> float:
        return self.profile.temperature_idle_celsius + self.die_rise + self.sink_rise

    @property
    def power(self) -> tuple[float, bool]:
        """Watts drawn now, and whether the power cap holds them."""
        return power_draw(self.profile, self.utilization)

    def advance(self, dt: float, utilization: float) -> None:
        """Move ``dt`` seconds forward with the engine keeping ``utilization`` of the GPU busy over that time."""
        p = self.profile
        self.utilization = min(1.0, max(0.0, utilization))
        idle_watts, hold = p.power_idle_watts, p.power_limit_watts * POWER_CAP_HOLD
        heat = (self.power[0] - idle_watts) / (hold - idle_watts) if hold > idle_watts else self.utilization
        rise = (p.temperature_busy_celsius - p.temperature_idle_celsius) * heat
        die_tau, sink_tau = p.die_time_constant_s, p.sink_time_constant_s
        if self.hot:
            rise = p.slowdown_temperature_celsius + HOT_MARGIN_CELSIUS - p.temperature_idle_celsius
            die_tau = sink_tau = HOT_TIME_CONSTANT_S
        share = p.temperature_die_share
        self.die_rise = _lag(self.die_rise, rise * share, dt, die_tau)
        self.sink_rise = _lag(self.sink_rise, rise * (1.0 - share), dt, sink_tau)

    def leak(self, nbytes: int) -> None:
        self.leaked_bytes += nbytes

    def add_xid(self, code: int, at: float) -> None:
        self.add_xids([code], at)

    def add_xids(self, codes: list[int], at: float) -> None:
        """Several XIDs logged at one instant: the agent's next read reports each of them."""
        self.xid_events.extend({"code": code, "at": at} for code in codes)

    def reading(self, now: float) -> dict[str, Any]:
        """The file's JSON object at unix time ``now``."""
        p = self.profile
        total = p.gpu_memory_bytes
        used = min(total, int(total * self.memory_utilization) + self.leaked_bytes)
        power, capped = self.power
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
            "power_idle_watts": p.power_idle_watts,
            "power_limit_watts": p.power_limit_watts,
            "throttle_reasons": [POWER_CAP] if capped else [],
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
