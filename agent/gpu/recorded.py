"""A GPU backend that replays recorded readings from a JSON fixture, for tests and demos.

Format: ``{"frames": [{"gpus": [GpuSample fields...], "processes": {"<pid>": bytes},
"gpu_processes": {"<gpu index>": {"<pid>": bytes}}}, ...]}`` (``gpu_processes`` optional). Each
``read`` returns the next frame; the last frame repeats once the recording runs out. A frame's ``xids`` are the
XID codes logged since the frame before (several XIDs in one interval are several codes), so a repeat of the
last frame carries none: nothing new was logged.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.gpu.base import GpuBackendError, GpuReading
from agent.wire import GpuSample


def _frame(raw: Any, source: Path, n: int) -> GpuReading:
    try:
        gpus = [GpuSample.model_validate(g) for g in raw.get("gpus", [])]
        procs = {int(pid): int(b) for pid, b in dict(raw.get("processes", {})).items()}
        per_gpu = {int(index): {int(pid): int(b) for pid, b in dict(on_gpu).items()}
                   for index, on_gpu in dict(raw.get("gpu_processes", {})).items()}
    except (ValidationError, AttributeError, TypeError, ValueError) as exc:
        raise GpuBackendError(f"{source}: frame {n}: {exc}") from exc
    return GpuReading(gpus=gpus, process_memory=procs, gpu_processes=per_gpu)


class RecordedGpuBackend:
    name = "recorded"

    def __init__(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise GpuBackendError(f"{path}: cannot load GPU recording: {exc}") from exc
        frames = data.get("frames") if isinstance(data, dict) else None
        if not isinstance(frames, list) or not frames:
            raise GpuBackendError(f"{path}: a GPU recording needs a non-empty 'frames' list")
        self._frames = [_frame(f, path, i) for i, f in enumerate(frames)]
        self._next = 0

    def read(self) -> GpuReading:
        frame = self._frames[min(self._next, len(self._frames) - 1)]
        repeat = self._next >= len(self._frames)
        self._next += 1
        if repeat and any(g.xids for g in frame.gpus):
            return replace(frame, gpus=[g.model_copy(update={"xids": []}) for g in frame.gpus])
        return frame

    def close(self) -> None:
        return None
