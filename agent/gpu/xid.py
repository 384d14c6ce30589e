"""XID codes: NVIDIA's catalog (https://docs.nvidia.com/deploy/xid-errors/) by blast radius, and the codes a GPU
logged between two reports.

One table for both sides: the agent labels its per-code counter with it, the control plane's xid detector acts
on it. Application-level XIDs are faults of the program on the GPU (a bad kernel, an illegal address):
restarting the engine clears them. Hardware-level XIDs mean the device or its links are failing: the GPU must
take no new work (cordon) and a human must look; restarting the engine there only moves the crash.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

from agent.wire import MAX_XIDS

__all__ = ["APPLICATION_XIDS", "HARDWARE_XIDS", "MAX_XIDS", "BlastRadius", "XidLedger", "classify_xid",
           "describe_xid", "merge_xids"]

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


def merge_xids(kept: Sequence[int], new: Iterable[int], cap: int = MAX_XIDS) -> list[int]:
    """``kept`` then ``new``, oldest first, at most ``cap`` codes.

    Past the cap the oldest repeat of a code still held goes first, so a storm of one code never pushes out a
    different one (a hardware XID followed by a thousand application XIDs keeps the hardware one); only with
    more than ``cap`` distinct codes does the oldest code go.
    """
    out = list(kept)
    for code in new:
        out.append(code)
        if len(out) > cap:
            counts = Counter(out)
            repeat = next((i for i, c in enumerate(out) if counts[c] > 1), 0)
            del out[repeat]
    return out


class XidLedger:
    """Per GPU index: how many of each XID code the agent has read (its per-code counter, from zero at agent
    start) and the codes not yet delivered to the control plane."""

    def __init__(self) -> None:
        self.counts: dict[int, dict[int, int]] = {}
        self._pending: dict[int, list[int]] = {}

    def observe(self, index: int, codes: Sequence[int]) -> None:
        """The codes one read of GPU ``index`` found (those logged since the previous read)."""
        if not codes:
            return
        counts = dict(self.counts.get(index, {}))
        for code in codes:
            counts[code] = counts.get(code, 0) + 1
        # Replaced, never changed in place: a scrape in another thread reads a whole, consistent copy.
        self.counts = {**self.counts, index: counts}
        self._pending[index] = merge_xids(self._pending.get(index, ()), codes)

    def pending(self, index: int) -> list[int]:
        return list(self._pending.get(index, ()))

    def take(self) -> dict[int, list[int]]:
        """The undelivered codes per GPU, handed to a report; forgotten unless ``requeue`` puts them back."""
        taken, self._pending = self._pending, {}
        return taken

    def requeue(self, taken: dict[int, list[int]]) -> None:
        """Put back the codes of a report that was not delivered, ahead of any read since."""
        for index, codes in taken.items():
            self._pending[index] = merge_xids(codes, self._pending.get(index, ()))
