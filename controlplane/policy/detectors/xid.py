"""XID events, classified by blast radius (NVIDIA XID catalog: https://docs.nvidia.com/deploy/xid-errors/).

Application-level XIDs are faults of the program on the GPU (a bad kernel, an illegal address): restarting
the engine clears them. Hardware-level XIDs mean the device or its links are failing: the GPU must take no
new work (cordon) and a human must look; restarting the engine there only moves the crash.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from controlplane.policy.conditions import XidCondition
from controlplane.policy.detectors.findings import Finding, evidence_of
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Gpu

BlastRadius = Literal["application", "hardware", "unknown"]

APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception (illegal instruction or address in a kernel)",
    31: "GPU memory page fault (illegal address access by the application)",
    43: "GPU stopped processing (the faulting context was killed)",
    45: "preemptive cleanup after an earlier error (the process was torn down)",
}
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit ECC error (uncorrectable memory error)",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}


def classify_xid(code: int) -> BlastRadius:
    """Which blast radius an XID code has; codes outside both tables are "unknown" (page, don't act)."""
    if code in HARDWARE_XIDS:
        return "hardware"
    if code in APPLICATION_XIDS:
        return "application"
    return "unknown"


def describe_xid(code: int) -> str:
    return HARDWARE_XIDS.get(code) or APPLICATION_XIDS.get(code) or "not in Pitstop's table; see NVIDIA's catalog"


def new_xids(gpu: Gpu, now: datetime, within: float) -> int:
    """XID events counted in the last ``within``: the rise of the cumulative counter over the window.

    Without readings that old, the whole counter counts (the first report after an agent start).
    """
    start = now - timedelta(seconds=within)
    readings = [r for r in gpu.history if r.at <= now and r.xid_events_total is not None]
    before = [r for r in readings if r.at <= start]
    if not before:
        return gpu.xid_events_total
    baseline = before[-1].xid_events_total or 0
    # A counter that went down was reset by an agent or driver restart; count from zero.
    return gpu.xid_events_total - baseline if gpu.xid_events_total >= baseline else gpu.xid_events_total


def detect_xid(cond: XidCondition, gpu: Gpu, now: datetime) -> Finding | None:
    """A finding when the GPU logged XIDs within the window and its last code has the condition's radius."""
    if gpu.last_xid is None:
        return None
    count = new_xids(gpu, now, cond.within)
    if count <= 0:
        return None
    radius = classify_xid(gpu.last_xid)
    if cond.blast_radius not in ("any", radius):
        return None
    start = now - timedelta(seconds=cond.within)
    return Finding(
        detector="xid",
        subject=gpu.key,
        summary=f"XID {gpu.last_xid} on GPU {gpu.index} of {gpu.node} ({radius}: {describe_xid(gpu.last_xid)}); "
        f"{count} event(s) in {format_duration(cond.within)}",
        measured={"xid": gpu.last_xid, "blast_radius": radius, "events": count, "uuid": gpu.uuid},
        evidence=evidence_of([r for r in gpu.history if start <= r.at <= now], ["xid_events_total"]),
    )
