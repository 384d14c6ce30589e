"""Fixtures for the observability tests: real processes (Pitstop's and Prometheus's) that are always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.procs import Processes

# Pitstop's processes and any binary beside them (Prometheus, Alertmanager): ``Processes.start_argv``.
StackProcesses = Processes


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StackProcesses]:
    procs = StackProcesses(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()
