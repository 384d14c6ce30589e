"""XID events, classified by blast radius (the table is ``agent.gpu.xid``'s, shared with the agent's exporter).

Application-level XIDs are faults of the program on the GPU (a bad kernel, an illegal address): restarting
the engine clears them. Hardware-level XIDs mean the device or its links are failing: the GPU must take no
new work (cordon) and a human must look; restarting the engine there only moves the crash.

Every code the GPU logged within the window is classified, not only the last one: a hardware XID followed by an
application XID (a failing GPU tears its contexts down: 79, then 45) is still a hardware XID. The application
condition leaves such a window to the hardware one: a restart on a failing GPU only moves the crash.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agent.gpu.xid import APPLICATION_XIDS, HARDWARE_XIDS, BlastRadius, classify_xid, describe_xid
from controlplane.policy.conditions import XidCondition
from controlplane.policy.detectors.findings import Finding, evidence_of, upto
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Gpu

__all__ = ["APPLICATION_XIDS", "HARDWARE_XIDS", "BlastRadius", "classify_xid", "describe_xid", "detect_xid",
           "new_xids", "xids_within"]


def new_xids(gpu: Gpu, now: datetime, within: float) -> int:
    """XID events counted in the last ``within``: the rise of the cumulative counter over the window.

    Without readings that old, the whole counter counts (the first report after an agent start).
    """
    start = now - timedelta(seconds=within)
    history = gpu.history
    # The baseline: the newest reading with a counter at or before both the window's start and now (the time-
    # ordered history is searched, not scanned: 8,000 GPUs, three XID policies, each round).
    before = upto(history, min(start, now))
    last = next((history[i].xid_events_total for i in range(before - 1, -1, -1)
                 if history[i].xid_events_total is not None), None)
    if last is None:
        return gpu.xid_events_total
    baseline = last or 0
    # A counter that went down was reset by an agent or driver restart; count from zero.
    return gpu.xid_events_total - baseline if gpu.xid_events_total >= baseline else gpu.xid_events_total


def xids_within(gpu: Gpu, now: datetime, within: float) -> list[int]:
    """Every XID code the GPU's readings of the last ``within`` carried, oldest first.

    An agent that predates ``xids`` reports only its last code: with no code in the window, ``last_xid`` stands
    for them all.
    """
    start = now - timedelta(seconds=within)
    codes = [code for r in gpu.history if start < r.at <= now for code in r.xids]
    if not codes and gpu.last_xid is not None:
        return [gpu.last_xid]
    return codes


def detect_xid(cond: XidCondition, gpu: Gpu, now: datetime) -> Finding | None:
    """A finding when the GPU logged XIDs within the window and one of them has the condition's radius."""
    count = new_xids(gpu, now, cond.within)
    if count <= 0:
        return None
    codes = xids_within(gpu, now, cond.within)
    radii = [classify_xid(c) for c in codes]
    if cond.blast_radius == "application" and "hardware" in radii:
        return None  # the hardware XID explains it, and its condition acts on the GPU
    matching = [c for c, radius in zip(codes, radii, strict=True) if cond.blast_radius in ("any", radius)]
    if not matching:
        return None
    code = matching[0]
    radius = classify_xid(code)
    seen = ", ".join(str(c) for c in _distinct(codes))
    start = now - timedelta(seconds=cond.within)
    return Finding(
        detector="xid",
        subject=gpu.key,
        summary=f"XID {code} on GPU {gpu.index} of {gpu.node} ({radius}: {describe_xid(code)}); "
        f"{count} event(s) in {format_duration(cond.within)}" + (f" (XIDs {seen})" if len(codes) > 1 else ""),
        measured={"xid": code, "blast_radius": radius, "events": count, "xids": seen, "uuid": gpu.uuid},
        evidence=evidence_of([r for r in gpu.history if start <= r.at <= now], ["xid_events_total", "xids"]),
    )


def _distinct(codes: list[int]) -> list[int]:
    return list(dict.fromkeys(codes))
