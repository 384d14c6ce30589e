"""Fixtures that run Pitstop's real processes on loopback ports and always stop them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.demo import Child

PITSTOP = [sys.executable, "-m", "pitstop.cli"]


class Processes:
    """Starts children in their own process groups; stops every one of them at teardown."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[Child] = []

    def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> Child:
        child = Child(name, [*PITSTOP, *argv], self.logs / f"{name}.log", env=env or {})
        child.start()
        self.children.append(child)
        return child

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for child in reversed(self.children):
            child.stop(grace=20)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()
