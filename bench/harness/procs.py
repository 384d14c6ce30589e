"""Real processes for benchmarks: each in its own process group, always stopped, logs kept in one folder."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from bench.harness.http import http_ok
from bench.harness.ports import free_port
from pitstop.demo import Child

__all__ = ["PITSTOP", "Processes", "free_port", "http_ok", "wait_until"]

PITSTOP = [sys.executable, "-m", "pitstop.cli"]


def wait_until(pred: Callable[[], bool], timeout: float, *, what: str, interval: float = 0.2) -> float:
    """Poll ``pred`` until it holds; returns the monotonic time it first held, raises TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Processes:
    """Starts children (Pitstop's or any binary) in their own groups; stops every one on exit, newest first."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[Child] = []

    def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> Child:
        return self.start_argv(name, [*PITSTOP, *argv], env=env)

    def start_argv(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        child = Child(name, argv, self.logs / f"{name}.log", env=env or {})
        child.start()
        self.children.append(child)
        return child

    def wait_serving(self, child: Child, url: str, timeout: float) -> None:
        """Wait for ``url`` to answer 200; fail at once, with the log, if ``child`` exits first (a port it could
        not bind, a config it refused) instead of waiting out ``timeout`` for a server that is gone."""
        wait_until(lambda: not child.alive() or http_ok(url), timeout, what=f"{child.name} at {url}")
        if not child.alive():
            raise RuntimeError(f"{child.name} exited before serving {url}:\n{self.log(child.name)[-3000:]}")

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        while self.children:
            self.children.pop().stop(grace=20)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()
