"""Thermal: a GPU near its own slowdown threshold for a sustained time, or throttling for heat.

The device reports its slowdown threshold through NVML (89 degC on an H200): read it, don't hard-code it;
the practitioners' 85 degC operating limit stands in when the device reports none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from controlplane.policy.conditions import ThermalCondition
from controlplane.policy.detectors.findings import Finding, due_at, evidence_of, held_for
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Gpu, GpuReading


def temperature_limit(cond: ThermalCondition, gpu: Gpu) -> float:
    """The temperature at which the condition counts as hot for this device."""
    if gpu.slowdown_temperature_celsius is not None:
        return gpu.slowdown_temperature_celsius - cond.margin_celsius
    return cond.default_limit_celsius


def _thermal_reasons(cond: ThermalCondition, reasons: Sequence[str]) -> list[str]:
    return [r for r in reasons if any(word.lower() in r.lower() for word in cond.throttle_reasons)]


def is_hot(cond: ThermalCondition, gpu: Gpu) -> Callable[[GpuReading], bool]:
    """Whether one reading of the GPU is at or past its limit, or throttled for heat."""
    limit = temperature_limit(cond, gpu)

    def hot(reading: GpuReading) -> bool:
        too_warm = reading.temperature_celsius is not None and reading.temperature_celsius >= limit
        return too_warm or bool(_thermal_reasons(cond, reading.throttle_reasons))

    return hot


def thermal_due(cond: ThermalCondition, gpu: Gpu, now: datetime) -> datetime | None:
    """When ``detect_thermal`` finds the heat under way if it goes on (``findings.due_at``)."""
    return due_at(gpu.history, now, cond.for_, is_hot(cond, gpu))


def detect_thermal(cond: ThermalCondition, gpu: Gpu, now: datetime) -> Finding | None:
    """A finding when every reading over the window was hot or thermally throttled."""
    limit = temperature_limit(cond, gpu)
    run = held_for(gpu.history, now, cond.for_, is_hot(cond, gpu))
    if run is None:
        return None
    temps = [r.temperature_celsius for r in run if r.temperature_celsius is not None]
    reasons = sorted({r for reading in run for r in _thermal_reasons(cond, reading.throttle_reasons)})
    peak = max(temps) if temps else None
    summary = (f"GPU {gpu.index} on {gpu.node} at or above {limit:g} degC for {format_duration(cond.for_)}"
               + (f" (peak {peak:g} degC)" if peak is not None else ""))
    if reasons:
        summary += f"; throttling: {', '.join(reasons)}"
    return Finding(
        detector="thermal",
        subject=gpu.key,
        summary=summary,
        measured={"limit_celsius": limit, "peak_celsius": peak, "throttle_reasons": ",".join(reasons)},
        evidence=evidence_of(run, ["temperature_celsius", "throttle_reasons"]),
    )
