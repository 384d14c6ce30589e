"""Uncorrected ECC errors: the GPU's volatile uncorrected count rose within the window.

An uncorrected (double-bit) error means a kernel read memory that was wrong: what the engine computed from it
may have been served. The count is NVML's volatile one (since the last GPU reset or driver load), so it goes
down only on a reset; the rise is counted like Prometheus's ``increase()``, a drop being a reset from zero.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from controlplane.policy.conditions import EccCondition
from controlplane.policy.detectors.findings import Finding, evidence_of
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Gpu, GpuReading


def ecc_increase(readings: list[GpuReading], now: datetime, within: float) -> int:
    """Uncorrected errors counted in the last ``within`` of the time-ordered ``readings``.

    The baseline is the last reading at or before the window's start; without one (a GPU new to the control
    plane) the whole count counts, as the first reading after a reset does.
    """
    start = now - timedelta(seconds=within)
    # The count first: the readings of a GPU that reports none are then never compared by time.
    counts = [(at, count) for r in readings if (count := r.ecc_uncorrected_total) is not None
              and (at := r.at) <= now]
    before = [c for at, c in counts if at <= start]
    previous = before[-1] if before else 0
    rise = 0
    for at, count in counts:
        if at <= start:
            continue
        rise += count - previous if count >= previous else count  # went down: a reset, counting from zero
        previous = count
    return rise


def detect_ecc(cond: EccCondition, gpu: Gpu, now: datetime) -> Finding | None:
    """A finding when the GPU's uncorrected ECC count rose by ``min_increase`` or more within the window."""
    rise = ecc_increase(gpu.history, now, cond.within)
    if rise < cond.min_increase:
        return None
    start = now - timedelta(seconds=cond.within)
    window = [r for r in gpu.history if start <= r.at <= now]
    latest = next((r.ecc_uncorrected_total for r in reversed(window) if r.ecc_uncorrected_total is not None), None)
    return Finding(
        detector="ecc",
        subject=gpu.key,
        summary=f"{rise} uncorrected ECC error(s) on GPU {gpu.index} of {gpu.node} in {format_duration(cond.within)}"
        + (f" (volatile count {latest})" if latest is not None else ""),
        measured={"errors": rise, "ecc_uncorrected_total": latest, "uuid": gpu.uuid},
        evidence=evidence_of(window, ["ecc_uncorrected_total"]),
    )
