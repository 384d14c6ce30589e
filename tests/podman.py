"""A real Podman for the container runtime's tests: its Docker-compatible API on a socket in the test's directory.

Each service has storage of its own (under the given directory, the vfs driver: no overlay mount needed) and the
settings this kind of host needs, through ``CONTAINERS_CONF`` rather than the machine's files: runc (crun cannot
set rlimits without CAP_SYS_RESOURCE here) and no default ulimits. No registry can be reached, so the image is
built here: ``podman import`` of an empty root filesystem, and the engine's environment (the system's libraries,
Python and this checkout with its virtualenv) is mounted read-only from the host at the same paths.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[1]
IMAGE = "localhost/pitstop-test-engine:1"
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


def engine_volumes() -> list[str]:
    """What the simulator needs from the host, read-only at the same paths: the system, Python and the checkout."""
    paths = {"/usr", "/bin", "/lib", "/lib64", "/etc/ssl", sys.base_prefix, str(REPO)}
    chosen: list[str] = []
    for path in sorted(p for p in paths if os.path.exists(p)):
        if not any(path.startswith(c.rstrip("/") + "/") for c in chosen):
            chosen.append(path)
    return [f"{p}:{p}:ro" for p in chosen]


class Podman:
    """``podman system service`` on ``<dir>/api.sock``; ``docker_host`` is what the agent is given."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
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
        tar = self.dir / "rootfs.tar"
        tar.write_bytes(_root_filesystem())
        if IMAGE not in self.cli("images", "--format", "{{.Repository}}:{{.Tag}}"):
            self.cli("import", str(tar), IMAGE)
        self.start_service()
        return self

    def start_service(self) -> None:
        self.socket.unlink(missing_ok=True)
        log = (self.dir / "service.log").open("ab")
        self.service = subprocess.Popen(["podman", *self.flags, "system", "service", "--time=0", self.docker_host],
                                        env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self.answers, 30, what="podman's API socket")

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

    def answers(self) -> bool:
        try:
            transport = httpx.HTTPTransport(uds=str(self.socket))
            with httpx.Client(transport=transport, base_url="http://podman", timeout=2) as client:
                return client.get("/v1.41/_ping").status_code == 200
        except (httpx.HTTPError, OSError):
            return False

    def containers(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Every container (running or not) carrying ``labels``, as ``podman ps -a`` lists it."""
        filters = [f"--filter=label={k}={v}" for k, v in labels.items()]
        return list(json.loads(self.cli("ps", "-a", "--format", "json", *filters) or "[]"))

    def close(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.cli("rm", "--all", "--force", "--time", "0", check=False)
        self.stop_service()
        shutil.rmtree(self.short, ignore_errors=True)
