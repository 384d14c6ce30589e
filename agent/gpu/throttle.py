"""NVML clocks-event ("throttle") reasons: the names the agent reports and which of them are faults.

The names follow dcgm-exporter's labels. A fault reason is the GPU slowing itself for heat or a hardware signal
(a power-brake assertion, an external slowdown): worth a look. The others are normal operation: measured on an
NVIDIA H200 under a saturating bf16 matmul, the GPU drew 691 W against its 700 W limit at 58 degC with
``sw_power_cap`` active, so power capping under full load must never page; ``gpu_idle`` is a GPU with nothing to
do, and the clock settings and sync boost are configuration.
"""

from __future__ import annotations

from collections.abc import Iterable

# NVML clocks-event reason bits (nvmlClocksEventReason*).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x01: "gpu_idle",
    0x02: "applications_clocks_setting",
    0x04: "sw_power_cap",
    0x08: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
KNOWN_REASONS: tuple[str, ...] = tuple(CLOCK_EVENT_REASONS.values())
FAULT_REASONS: frozenset[str] = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"})
POWER_CAP = "sw_power_cap"


def decode_reasons(mask: int) -> list[str]:
    """The reason names set in an NVML clocks-event bit mask, in bit order."""
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


def is_fault(reason: str) -> bool:
    return reason in FAULT_REASONS


def fault_reasons(reasons: Iterable[str]) -> list[str]:
    """The fault reasons among ``reasons`` (power capping, idling and clock settings are not faults)."""
    return [r for r in reasons if r in FAULT_REASONS]
