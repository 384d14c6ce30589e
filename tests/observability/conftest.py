"""Fixtures for the observability tests: real processes (Pitstop's and Prometheus's) that are always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.demo import Child
from tests.integration.conftest import Processes


class StackProcesses(Processes):
    """``Processes`` that can also start a non-Pitstop binary (Prometheus, Alertmanager)."""

    def start_argv(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.logs / f"{name}.log")
        child.start()
        self.children.append(child)
        return child


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StackProcesses]:
    procs = StackProcesses(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()
