"""A throw-away PostgreSQL (Debian's server binaries, pg_ctl in a temp dir) and a fresh database per test."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from glob import glob
from pathlib import Path

import psycopg

from tests.helpers import free_port


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def missing_reason() -> str | None:
    if pg_bin("initdb") is None or pg_bin("pg_ctl") is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: cannot start PostgreSQL as another user"
    return None


def _as_postgres(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; CI containers often are root.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server on a loopback port; yield ``host:port``; stop it and remove its files."""
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    assert initdb is not None and pg_ctl is not None
    workdir = Path(tempfile.mkdtemp(prefix="pitstop-pg-"))
    data, port = workdir / "data", free_port()
    try:
        if os.geteuid() == 0:
            shutil.chown(workdir, "postgres")
        subprocess.run(_as_postgres([initdb, "-D", str(data), "-U", "pitstop", "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True, timeout=120)
        options = f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-o", options, "-l", str(workdir / "pg.log"),
                                     "-w", "-t", "60", "start"]), check=True, capture_output=True, timeout=90)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, timeout=60)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def fresh_database(address: str) -> Iterator[str]:
    """A new, empty database on the server at ``address``; dropped afterwards (connections and all)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = f"postgresql://pitstop@{address}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://pitstop@{address}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
