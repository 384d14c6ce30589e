"""The suite runs side by side in several pytest-xdist workers; this file keeps them out of each other's way.

- Ports: each worker draws loopback ports from its own block (``bench.harness.ports``), so two workers never
  hand the same port to two servers, and no outgoing connection can take a port between its choice and its bind.
- ``solo``: a test that measures the machine (a CPU share, reaction times compared, millisecond timings) runs
  alone. Before each test a worker takes a shared lock, a ``solo`` test an exclusive one; a turnstile lock in front
  of both lets a waiting ``solo`` test in before any test that arrives after it, so it is never starved.
- ``xdist_group``: a module whose tests share one costly module-scoped fixture (a real vLLM, a fleet) is kept on
  one worker by ``--dist loadgroup`` (set in pyproject.toml).
- ``early``: a test that mostly waits for minutes is collected first, so a worker starts it at once and the others
  run the rest beside it, instead of its minutes coming at the end of the part.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.harness import ports
from pitstop import local_podman as podman_service


def _worker() -> tuple[int, int] | None:
    """This worker's index and the number of workers, or None outside pytest-xdist."""
    name, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not name or not count:
        return None
    return int(name.removeprefix("gw")), int(count)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("early") is None)  # stable: the rest keep their order


def pytest_configure(config: pytest.Config) -> None:
    worker = _worker()
    if worker is not None:
        ports.use_block(ports.slice_of(ports.root_block(), *worker))


@contextmanager
def _locked(path: Path, operation: int) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, operation)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of a ``solo`` test with no other test running; others side by side."""
    run_id = getattr(item.config, "workerinput", {}).get("testrunuid")
    if run_id is None:  # one process: nothing runs beside anything
        yield
        return
    locks = Path(os.environ.get("TMPDIR", "/tmp")) / f"pitstop-tests-{run_id}"
    locks.mkdir(exist_ok=True)
    solo = item.get_closest_marker("solo") is not None
    with _locked(locks / "turnstile", fcntl.LOCK_EX):
        held = (locks / "tests").open("a")
        fcntl.flock(held, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[podman_service.Podman]:
    """A real Podman serving the Docker API on a socket of its own (``pitstop/local_podman.py``), for engines in
    containers."""
    assert podman_service.available(), "podman and runc are needed: make deps installs them"
    service = podman_service.Podman(tmp_path_factory.mktemp("podman")).start()
    try:
        yield service
    finally:
        service.close()
