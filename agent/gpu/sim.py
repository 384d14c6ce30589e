"""A GPU backend that reads the engine simulator's per-process JSON files (no GPU needed).

The simulator writes one file per (gpu, pid), ``gpu<index>-<pid>.json``, with keys pid, gpu_index, uuid, name,
updated_at, memory_total_bytes, memory_used_bytes (that process's), utilization_ratio, power_watts,
power_idle_watts, power_limit_watts, temperature_celsius, slowdown_temperature_celsius,
shutdown_temperature_celsius, throttle_reasons and xid_events ``[{code, at}]`` (``enginesim/gpufile.py``). Per
GPU index, over files whose pid is alive: memory is the sum, utilisation and temperature the maximum; power is
the idle GPU's plus each file's draw above its own idle (a file without ``power_idle_watts`` gives only that
part), capped at the limit, which reads ``sw_power_cap``; throttle reasons are the files' together (a GPU at
its slowdown temperature adds ``hw_thermal_slowdown``); XID events are counted (each event once, so the total
never goes down when a file disappears) and the codes first seen by a read are its ``xids``. An index with no
file reads as an idle GPU.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from agent.gpu.base import GpuReading
from agent.gpu.throttle import KNOWN_REASONS, POWER_CAP
from agent.gpu.xid import merge_xids
from agent.wire import (
    INT64_MAX,
    MAX_POWER_WATTS,
    MAX_TEMPERATURE_CELSIUS,
    MIN_TEMPERATURE_CELSIUS,
    GpuSample,
    bounded,
)

FILE_PATTERN = re.compile(r"^gpu(\d+)-(\d+)\.json$")


@dataclass(frozen=True)
class IdleGpu:
    """What a simulated GPU reads with nothing on it (an H200's figures, measured)."""

    name: str = "NVIDIA H200 (simulated)"
    memory_total_bytes: int = 150_754_820_096
    power_watts: float = 77.0
    power_limit_watts: float = 700.0
    temperature_celsius: float = 35.0
    slowdown_temperature_celsius: float = 89.0
    shutdown_temperature_celsius: float = 95.0  # what an H200's NVML reports


def _order(at: str) -> float:
    try:
        return float(at)
    except ValueError:
        return 0.0


def _above_idle(raw: dict[str, Any]) -> float:
    """What one process's file draws above its own idle (a file without an idle figure: all it gives)."""
    return max(0.0, (_num(raw, "power_watts") or 0.0) - (_num(raw, "power_idle_watts") or 0.0))


def _celsius(value: float | None) -> float | None:
    return bounded(value, MIN_TEMPERATURE_CELSIUS, MAX_TEMPERATURE_CELSIUS)


def _bytes(value: float) -> int | None:
    return bounded(int(value), 0, INT64_MAX) if math.isfinite(value) else None


def _num(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None  # JSON from a file may say NaN or Infinity: unknown, like a missing key
    return float(value)


class SimGpuBackend:
    name = "sim"

    def __init__(self, directory: Path, count: int = 1, idle: IdleGpu | None = None,
                 pid_alive: Callable[[int], bool] = psutil.pid_exists) -> None:
        self.directory = directory
        self.count = count
        self.idle = idle or IdleGpu()
        self.pid_alive = pid_alive
        self._xids_seen: dict[int, set[tuple[int, int, int, str]]] = {}
        self._last_xid: dict[int, int] = {}

    def _load(self) -> dict[int, list[dict[str, Any]]]:
        by_index: dict[int, list[dict[str, Any]]] = {i: [] for i in range(self.count)}
        try:
            paths = sorted(self.directory.iterdir())
        except OSError:  # no directory yet: nothing runs on the simulated GPUs
            return by_index
        for path in paths:
            match = FILE_PATTERN.match(path.name)
            if match is None:
                continue
            index, pid = int(match.group(1)), int(match.group(2))
            if index not in by_index or not self.pid_alive(pid):
                continue
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError):  # mid-write or removed: skip this round, read it next time
                continue
            if isinstance(raw, dict):
                raw.setdefault("pid", pid)
                by_index[index].append(raw)
        return by_index

    def _new_xids(self, index: int, files: list[dict[str, Any]]) -> list[int]:
        """Codes of the events no earlier read saw, oldest first; each event counts once."""
        seen = self._xids_seen.setdefault(index, set())
        new: list[tuple[str, int]] = []
        for raw in files:
            # A file's events only grow, so an event is its process, place in the list, code and time: two of
            # one code at one instant are two events.
            for n, event in enumerate(raw.get("xid_events") or []):
                code = event.get("code") if isinstance(event, dict) else None
                if isinstance(code, int) and bounded(code, 0, INT64_MAX) is not None:  # what the wire carries
                    key = (int(raw["pid"]), n, code, str(event.get("at")))
                    if key not in seen:
                        seen.add(key)
                        new.append((str(event.get("at")), code))
        codes = [code for _, code in sorted(new, key=lambda e: _order(e[0]))]
        if codes:
            self._last_xid[index] = codes[-1]
        return merge_xids((), codes)

    def _aggregate(self, index: int, files: list[dict[str, Any]]) -> GpuSample:
        idle = self.idle
        xids = self._new_xids(index, files)

        def values(key: str) -> list[float]:
            return [v for v in (_num(r, key) for r in files) if v is not None]

        limit = max(values("power_limit_watts"), default=idle.power_limit_watts)
        drawn = idle.power_watts + sum(_above_idle(r) for r in files)
        temperature = max(values("temperature_celsius"), default=idle.temperature_celsius)
        slowdown = max(values("slowdown_temperature_celsius"), default=idle.slowdown_temperature_celsius)
        reasons = {str(r) for raw in files for r in raw.get("throttle_reasons") or [] if isinstance(r, str)}
        if drawn >= limit:
            reasons.add(POWER_CAP)
        if temperature >= slowdown:
            reasons.add("hw_thermal_slowdown")
        first = files[0] if files else {}
        # What the wire cannot carry (a file that says 10^6 °C) reads as unknown, as NVML's backend does.
        return GpuSample(
            index=index,
            uuid=str(first.get("uuid") or f"GPU-00000000-0000-0000-0000-{index:012d}"),
            name=str(first.get("name") or idle.name),
            temperature_celsius=_celsius(temperature),
            slowdown_temperature_celsius=_celsius(slowdown),
            shutdown_temperature_celsius=_celsius(max(values("shutdown_temperature_celsius"),
                                                      default=idle.shutdown_temperature_celsius)),
            memory_used_bytes=_bytes(sum(values("memory_used_bytes"))),
            memory_total_bytes=_bytes(max(values("memory_total_bytes"), default=idle.memory_total_bytes)),
            utilization_ratio=min(1.0, max(0.0, max(values("utilization_ratio"), default=0.0))),
            power_watts=bounded(min(limit, drawn), 0, MAX_POWER_WATTS),
            power_limit_watts=bounded(limit, 0, MAX_POWER_WATTS),
            throttle_reasons=[r for r in KNOWN_REASONS if r in reasons],
            ecc_uncorrected_total=0,
            xid_events_total=len(self._xids_seen.get(index, ())),
            last_xid=self._last_xid.get(index),
            xids=xids,
        )

    def read(self) -> GpuReading:
        by_index = self._load()
        per_pid: dict[int, int] = {}
        per_gpu: dict[int, dict[int, int]] = {}
        for index, files in by_index.items():
            on_gpu = per_gpu.setdefault(index, {})
            for raw in files:
                used = _num(raw, "memory_used_bytes")
                if used is not None:
                    pid = int(raw["pid"])
                    per_pid[pid] = per_pid.get(pid, 0) + int(used)
                    on_gpu[pid] = on_gpu.get(pid, 0) + int(used)
        gpus = [self._aggregate(i, files) for i, files in sorted(by_index.items())]
        return GpuReading(gpus=gpus, process_memory=per_pid, gpu_processes=per_gpu)

    def close(self) -> None:
        return None
