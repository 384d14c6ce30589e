"""Medians, ratios, a printed table and the JSON file every benchmark writes."""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SHARED_HOST_NOTE = ("the load generator, Prometheus, HAProxy and the measured processes share this host's "
                    "{cores} CPU cores, so latencies include contention from the measurement itself")


REPO = Path(__file__).resolve().parents[2]


def shown_path(path: Path) -> str:
    """An output path as a results document records it: relative to the repository, never the host's layout."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else path.name


def median(values: Sequence[float | None]) -> float | None:
    """The median of the figures that exist; None when there are none."""
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def ratio(baseline: float | None, pitstop: float | None) -> float | None:
    """How many times larger the baseline figure is than Pitstop's (None when either is missing or zero)."""
    if baseline is None or pitstop is None or pitstop <= 0:
        return None
    return baseline / pitstop


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *rows]]
    return "\n".join(lines)


def host_note() -> str:
    return SHARED_HOST_NOTE.format(cores=os.cpu_count())


def write_json(path: Path, benchmark: str, body: dict[str, Any]) -> None:
    """One JSON document per run of a benchmark: what ran, where, when, and its figures."""
    doc = {"benchmark": benchmark, "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
           "note": host_note(), **body}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
