"""The real GPU backend: NVIDIA's NVML through nvidia-ml-py (``import pynvml``).

Thresholds are read, not hard-coded (an H200 reports its own 89 °C slowdown). XID critical errors are
counted from an NVML event set drained on every read: a count, never a sticky last value, so an alert can
fire on ``increase()``, and every code drained goes into that read's ``xids`` (two XIDs between reads are two
codes, not only the last). Every field that the driver does not support reads as ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from agent.gpu.base import GpuBackendError, GpuReading
from agent.gpu.throttle import CLOCK_EVENT_REASONS, decode_reasons
from agent.gpu.xid import merge_xids
from agent.wire import (
    INT64_MAX,
    MAX_POWER_WATTS,
    MAX_TEMPERATURE_CELSIUS,
    MIN_TEMPERATURE_CELSIUS,
    GpuSample,
    bounded,
)

T = TypeVar("T")

__all__ = ["CLOCK_EVENT_REASONS", "NvmlGpuBackend", "decode_reasons"]


class NvmlGpuBackend:
    name = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # the agent extra was not installed
            raise GpuBackendError("nvidia-ml-py is not installed") from exc
        self.nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuBackendError(f"NVML did not initialise: {exc}") from exc
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.xids: dict[int, int] = {i: 0 for i in range(len(self.handles))}
        self.last_xid: dict[int, int] = {}
        self.new_xids: dict[int, list[int]] = {}  # codes drained by the current read, per GPU
        self.events: Any = None
        try:
            self.events = pynvml.nvmlEventSetCreate()
            for handle in self.handles:
                self._try(partial(pynvml.nvmlDeviceRegisterEvents, handle,
                                  pynvml.nvmlEventTypeXidCriticalError, self.events))
        except pynvml.NVMLError:  # events unsupported (some VMs): XIDs read 0, the rest still works
            self.events = None

    def _try(self, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except self.nvml.NVMLError:
            return None

    def _drain_xids(self) -> None:
        nvml = self.nvml
        self.new_xids = {}
        if self.events is None:
            return
        index_of = {id(h): i for i, h in enumerate(self.handles)}
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(self.events, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: no more pending events
                return
            found = self._try(partial(nvml.nvmlDeviceGetIndex, data.device))
            index = int(found) if found is not None else index_of.get(id(data.device), 0)
            self.xids[index] = self.xids.get(index, 0) + 1
            code = _count(int(data.eventData))
            if code is not None:  # a code past what the wire carries is counted, not named
                self.last_xid[index] = code
                self.new_xids[index] = merge_xids(self.new_xids.get(index, ()), [code])

    def _sample(self, index: int, handle: Any, per_pid: dict[int, int], on_gpu: dict[int, int]) -> GpuSample:
        nvml = self.nvml
        t = self._try
        memory = t(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        util = t(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        power = t(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        limit = t(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        reasons = t(lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        if reasons is None:
            reasons = t(lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        ecc = t(lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
        for proc in t(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []:
            used = getattr(proc, "usedGpuMemory", None)
            if isinstance(used, int):
                per_pid[int(proc.pid)] = per_pid.get(int(proc.pid), 0) + used
                on_gpu[int(proc.pid)] = on_gpu.get(int(proc.pid), 0) + used
        uuid = t(lambda: nvml.nvmlDeviceGetUUID(handle))
        name = t(lambda: nvml.nvmlDeviceGetName(handle))
        # A reading outside what the wire accepts (a sensor or driver gone wrong) is unknown: never a report the
        # control plane refuses, nor a read that fails.
        return GpuSample(
            index=index,
            uuid=_text(uuid) or f"GPU-unknown-{index}",
            name=_text(name) or "unknown",
            temperature_celsius=_celsius(t(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            slowdown_temperature_celsius=_celsius(t(lambda: nvml.nvmlDeviceGetTemperatureThreshold(
                handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))),
            shutdown_temperature_celsius=_celsius(t(lambda: nvml.nvmlDeviceGetTemperatureThreshold(
                handle, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))),
            memory_used_bytes=_count(memory.used) if memory is not None else None,
            memory_total_bytes=_count(memory.total) if memory is not None else None,
            utilization_ratio=bounded(min(1.0, util.gpu / 100.0), 0, 1) if util is not None else None,
            power_watts=_watts(power),
            power_limit_watts=_watts(limit),
            throttle_reasons=decode_reasons(int(reasons)) if reasons is not None else [],
            ecc_uncorrected_total=_count(ecc) if ecc is not None else None,
            xid_events_total=self.xids.get(index, 0),
            last_xid=self.last_xid.get(index),
            xids=self.new_xids.get(index, []),
        )

    def read(self) -> GpuReading:
        self._drain_xids()
        per_pid: dict[int, int] = {}
        per_gpu: dict[int, dict[int, int]] = {i: {} for i in range(len(self.handles))}
        gpus = [self._sample(i, h, per_pid, per_gpu[i]) for i, h in enumerate(self.handles)]
        return GpuReading(gpus=gpus, process_memory=per_pid, gpu_processes=per_gpu)

    def close(self) -> None:
        if self.events is not None:
            self._try(lambda: self.nvml.nvmlEventSetFree(self.events))
            self.events = None
        self._try(self.nvml.nvmlShutdown)


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _celsius(value: object) -> float | None:
    return bounded(_float(value), MIN_TEMPERATURE_CELSIUS, MAX_TEMPERATURE_CELSIUS)


def _watts(milliwatts: object) -> float | None:
    value = _float(milliwatts)
    return bounded(value / 1000.0 if value is not None else None, 0, MAX_POWER_WATTS)


def _count(value: object) -> int | None:
    return bounded(int(value), 0, INT64_MAX) if isinstance(value, int) else None
