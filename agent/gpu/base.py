"""The GPU seam: a narrow ``GpuBackend`` protocol that real NVML and the in-repo fakes both implement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agent.wire import GpuSample


@dataclass(frozen=True)
class GpuReading:
    """One read of every GPU on the node, plus GPU memory per process id (summed over GPUs), and per GPU
    index the memory of each process on it (where the backend can tell; orphan detection reads it)."""

    gpus: list[GpuSample] = field(default_factory=list)
    process_memory: dict[int, int] = field(default_factory=dict)
    gpu_processes: dict[int, dict[int, int]] = field(default_factory=dict)


class GpuBackend(Protocol):
    """Where GPU readings come from. ``read`` must not raise for a field it cannot read: that field is None."""

    name: str

    def read(self) -> GpuReading: ...

    def close(self) -> None: ...


class GpuBackendError(RuntimeError):
    """A backend that cannot start at all (no driver, no fixture file)."""
