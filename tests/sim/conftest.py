"""Fixtures that start the simulator as a real process on a free loopback port and always stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import free_port, http_ok, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    port: int
    gpu_dir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text()

    def wait_ready(self, timeout: float = 15.0, path: str = "/health") -> None:
        wait_until(lambda: self.proc.poll() is not None or http_ok(self.url + path), timeout,
                   what=f"simulator {path}")
        assert self.proc.poll() is None, f"simulator exited early:\n{self.output()}"

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


StartSim = Callable[..., SimProcess]


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[StartSim]:
    """Start ``pitstop sim serve`` with extra args; waits for ``ready`` (/health) to answer 200 unless
    ``wait=False``."""
    started: list[SimProcess] = []

    def start(*args: str, wait: bool = True, env: dict[str, str] | None = None, startup: float = 0.2,
              profile: str = "tiny-cpu", ready: str = "/health") -> SimProcess:
        port = free_port()
        gpu_dir = tmp_path / f"gpu-{port}"
        log = tmp_path / f"sim-{port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_SIM_")}
        full_env.update(env or {})
        cmd = [sys.executable, "-m", "pitstop.cli", "sim", "serve", "test-model", "--port", str(port),
               "--sim-profile", profile, "--sim-startup-seconds", str(startup), "--sim-gpu-dir", str(gpu_dir),
               *args]
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
                                    env=full_env)
        sim = SimProcess(proc=proc, port=port, gpu_dir=gpu_dir, log=log)
        started.append(sim)
        if wait:
            sim.wait_ready(path=ready)
        return sim

    try:
        yield start
    finally:
        for sim in started:
            if sim.proc.poll() is None:
                sim.proc.kill()
            sim.proc.wait(timeout=10)
