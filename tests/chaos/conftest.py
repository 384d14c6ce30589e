"""One PostgreSQL server for the module, a fresh database and a fresh fleet for each case (its engines processes
or containers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.local_podman import Podman
from tests.chaos.harness import Fleet
from tests.controlplane.pg import fresh_database, missing_reason, postgres_server


@pytest.fixture(scope="module")
def pg_address() -> Iterator[str]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with postgres_server() as address:
        yield address


def _fleet(pg_address: str, tmp_path: Path, podman: Podman | None) -> Iterator[Fleet]:
    with fresh_database(pg_address) as url:
        fleet = Fleet(tmp_path, url, podman=podman)
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.stop()


@pytest.fixture
def fleet(pg_address: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from _fleet(pg_address, tmp_path, None)


@pytest.fixture
def container_fleet(pg_address: str, tmp_path: Path, podman: Podman) -> Iterator[Fleet]:
    """The same fleet with every engine in a Podman container (``runtime: container``)."""
    yield from _fleet(pg_address, tmp_path, podman)
