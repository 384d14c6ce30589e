"""GPU readings behind one protocol: ``nvml`` (real), ``sim`` (simulator files), ``recorded`` (a fixture).

The backends are imported when one is opened: the pure tables beside them (``agent.gpu.xid``,
``agent.gpu.throttle``) are imported by the control plane's policy engine, which must not pull in psutil or NVML.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.gpu.base import GpuBackend, GpuBackendError, GpuReading

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["GpuBackend", "GpuBackendError", "GpuReading", "open_backend"]

log = logging.getLogger(__name__)


def open_backend(kind: str, sim_dir: Path, sim_count: int = 1, recorded: Path | None = None) -> GpuBackend:
    """The configured backend; ``auto`` is NVML when it initialises, else the simulator's files."""
    if kind == "recorded":
        from agent.gpu.recorded import RecordedGpuBackend

        if recorded is None:
            raise GpuBackendError("gpu_backend 'recorded' needs recorded_gpu_file")
        return RecordedGpuBackend(recorded)
    from agent.gpu.sim import SimGpuBackend

    if kind == "sim":
        return SimGpuBackend(sim_dir, sim_count)
    from agent.gpu.nvml import NvmlGpuBackend

    if kind == "nvml":
        return NvmlGpuBackend()
    try:
        return NvmlGpuBackend()
    except GpuBackendError as exc:
        log.info("no NVML (%s); reading simulated GPUs from %s", exc, sim_dir)
        return SimGpuBackend(sim_dir, sim_count)
