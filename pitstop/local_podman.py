"""A Podman of Pitstop's own, for engines in containers where no registry is needed: ``pitstop demo --containers``,
the container runtime's tests and its benchmark. Its Docker-compatible API is served on a socket of its own, and
the agent drives it exactly as it would drive Docker.

The service has storage of its own (under the given directory, with the vfs driver: no overlay mount needed) and
settings of its own through ``CONTAINERS_CONF`` rather than the machine's files: runc (crun cannot set rlimits
without CAP_SYS_RESOURCE on some hosts, and its cgroup handling fails on hybrid cgroups) and no default ulimits.
The engine image is built here, never pulled: ``podman import`` of an empty root filesystem, and the engine's
environment (the system's libraries, Python, this installation of Pitstop with its virtual environment) is
mounted read-only from the host at the same paths (``engine_volumes``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

import pitstop

# Where this installation of Pitstop lives: the checkout for an editable install, else the site-packages folder.
INSTALLED = Path(pitstop.__file__).resolve().parents[1]
IMAGE = "localhost/pitstop-engine:1"
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
runtime = "runc"
"""


def available() -> bool:
    return shutil.which("podman") is not None and shutil.which("runc") is not None


def _root_filesystem() -> bytes:
    """An empty root filesystem: the directories a container's mounts need, and nothing else."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in ("etc", "tmp", "proc", "sys", "dev", "run", "root", "var", "var/tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name.endswith("tmp") else 0o755
            tar.addfile(info)
    return out.getvalue()


def _client(docker_host: str, timeout: float) -> httpx.Client:
    socket = docker_host.removeprefix("unix://")
    return httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://docker/v1.41", timeout=timeout)


def answers(docker_host: str) -> bool:
    """Whether a daemon serves the Docker API on ``docker_host`` (a ``unix://`` socket)."""
    try:
        with _client(docker_host, 2) as client:
            return client.get("/_ping").status_code == 200
    except (httpx.HTTPError, OSError):
        return False


def ensure_engine_image(docker_host: str, image: str = IMAGE) -> None:
    """Import the engine image (an empty root filesystem) through the daemon's API, Docker's or Podman's, unless it
    is there already. Nothing is pulled."""
    with _client(docker_host, 60) as client:
        if client.get(f"/images/{image}/json").status_code == 200:
            return
        # "repo" with its tag: both daemons take that form (Podman ignores a separate "tag" on import).
        answer = client.post("/images/create", params={"fromSrc": "-", "repo": image}, content=_root_filesystem(),
                             headers={"Content-Type": "application/x-tar"})
        if answer.status_code >= 400 or client.get(f"/images/{image}/json").status_code != 200:
            raise RuntimeError(f"the daemon on {docker_host} did not import {image}: {answer.text[:300]}")


def engine_volumes() -> list[str]:
    """What the simulator needs from the host, read-only at the same paths: the system, Python, the virtual
    environment and this installation of Pitstop."""
    paths = {"/usr", "/bin", "/lib", "/lib64", "/etc/ssl", sys.base_prefix, sys.prefix, str(INSTALLED)}
    chosen: list[str] = []
    for path in sorted(p for p in paths if os.path.exists(p)):
        if not any(path.startswith(c.rstrip("/") + "/") for c in chosen):
            chosen.append(path)
    return [f"{p}:{p}:ro" for p in chosen]


class Podman:
    """``podman system service`` on ``<dir>/api.sock``; ``docker_host`` is what the agent is given."""

    def __init__(self, directory: Path, env: Mapping[str, str] | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, **(env or {}), "CONTAINERS_CONF": str(conf)}
        # Podman refuses a run root of 50 characters or more: it and the socket live in a short folder of /tmp.
        self.short = Path(tempfile.mkdtemp(prefix="pitstop-pm-", dir="/tmp"))
        self.socket = self.short / "api.sock"
        self.docker_host = f"unix://{self.socket}"
        self.flags = ["--root", str(self.dir / "storage"), "--runroot", str(self.short / "run"),
                      "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        self.service: subprocess.Popen[bytes] | None = None

    def cli(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["podman", *self.flags, *args], env=self.env, capture_output=True, text=True,
                              timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}: {done.stderr}")
        return done.stdout

    def start(self) -> Podman:
        self.start_service()
        ensure_engine_image(self.docker_host)
        return self

    def start_service(self) -> None:
        self.socket.unlink(missing_ok=True)
        log = (self.dir / "service.log").open("ab")
        self.service = subprocess.Popen(["podman", *self.flags, "system", "service", "--time=0", self.docker_host],
                                        env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not answers(self.docker_host):
            if time.monotonic() > deadline:
                raise TimeoutError(f"podman's API socket did not answer within 30 s: {self.dir / 'service.log'}")
            time.sleep(0.1)

    def stop_service(self) -> None:
        """The daemon goes away; its containers run on (each has its own conmon)."""
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            try:
                self.service.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait()
        self.service = None

    def containers(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Every container (running or not) carrying ``labels``, as ``podman ps -a`` lists it."""
        filters = [f"--filter=label={k}={v}" for k, v in labels.items()]
        return list(json.loads(self.cli("ps", "-a", "--format", "json", *filters) or "[]"))

    def close(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.cli("rm", "--all", "--force", "--time", "0", check=False)
        self.stop_service()
        shutil.rmtree(self.short, ignore_errors=True)
