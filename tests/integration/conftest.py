"""Fixtures that run Pitstop's real processes on loopback ports and always stop them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.procs import Processes
from tests.agent.conftest import start_agent  # a real agent process, as the agent's tests start one

__all__ = ["Processes", "processes", "start_agent"]


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()
