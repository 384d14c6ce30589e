"""Cordon (no new replicas, drain the running ones) and GPU orphans (processes no replica started)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest

from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.orphans import OrphanWatch, candidates
from agent.wire import DesiredState
from bench.harness.http import probe
from tests.agent.conftest import AgentProcess, ControlPlaneStandIn, group_alive
from tests.agent.test_agent_slow import sim_replica
from tests.helpers import wait_until

GIB = 2**30


def test_candidates_are_gpu_processes_nobody_owns() -> None:
    per_gpu = {0: {10: GIB, 11: 2 * GIB, 12: 0}, 1: {11: GIB, 13: GIB}}
    assert candidates(per_gpu, owned={10}) == [(11, 0, 2 * GIB), (11, 1, GIB), (13, 1, GIB)]


def test_each_orphan_is_announced_once_and_forgotten_when_gone() -> None:
    watch = OrphanWatch(describe=lambda pid: f"cmd-{pid}", in_engine=lambda pid, roots: pid in (7, 8))
    first = watch.check({0: {5: GIB, 7: GIB}}, owned=[], roots={7})
    assert [(o.pid, o.gpu, o.command) for o in first] == [(5, 0, "cmd-5")]  # 7 is an engine's child
    assert watch.check({0: {5: GIB}}, owned=[], roots={7}) == []
    assert watch.per_gpu() == {0: 1}
    assert watch.check({0: {}}, owned=[], roots=set()) == []
    assert watch.per_gpu() == {}


@pytest.fixture
def stray() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # stray-engine"],
                            start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _sim_gpu_file(directory: Path, gpu: int, pid: int, used: int) -> None:
    # The engine simulator's per-process GPU file (enginesim/gpufile.py), as a stray sim engine leaves it.
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"gpu{gpu}-{pid}.json").write_text(json.dumps(
        {"pid": pid, "gpu_index": gpu, "memory_used_bytes": used, "memory_total_bytes": 80 * GIB}))


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True])
def test_agent_reports_a_stray_gpu_process_and_kills_it_only_when_told(
        tmp_path: Path, stray: subprocess.Popen[bytes], kill: bool) -> None:
    simgpu = tmp_path / "simgpu"
    _sim_gpu_file(simgpu, 1, stray.pid, 3 * GIB)
    config = AgentConfig.model_validate({
        "node": "n1", "control_plane": None, "gpu_backend": "sim", "sim_gpu_dir": str(simgpu),
        "sim_gpu_count": 2, "state_dir": str(tmp_path / "state"), "kill_orphans": kill,
        "orphan_check_interval": 0.01,
        "replicas": [{"name": "r0", "model": "m", "port": 1, "gpus": [0]},
                     {"name": "r1", "model": "m", "port": 2, "gpus": [1]}]})

    async def scenario() -> tuple[list[str], str]:
        async with httpx.AsyncClient() as client:
            agent = Agent(config, client, SimGpuBackend(simgpu, 2))
            for replica in agent.replicas.values():  # each has looked for a previous agent's engine (run() does)
                replica.looked_for_leftovers = True
            await agent.collect_once()
            await asyncio.sleep(0.05)
            await agent.collect_once()  # announced once, not per check
            events = [e.message for e in agent.replicas["r1"].machine.drain_events() if e.kind == "orphan"]
            return events, generate_latest(agent.registry).decode()

    events, metrics = asyncio.run(scenario())
    assert len(events) == 1
    assert f"pid {stray.pid} holds 3072 MiB on GPU 1" in events[0] and "stray-engine" in events[0]
    assert 'pitstop_gpu_orphan_processes{gpu="1",node="n1"} 1.0' in metrics
    assert 'pitstop_gpu_orphan_processes{gpu="0",node="n1"} 0.0' in metrics
    if kill:
        wait_until(lambda: stray.poll() is not None, 5, what="the orphan ended")
    else:
        assert stray.poll() is None  # reported, never touched


@pytest.mark.slow
def test_cordon_drains_and_keeps_stopped_then_uncordon_converges_back(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, url = control_plane
    agent = start_agent([sim_replica("a"), sim_replica("b", enabled=False)], control_plane=url)
    first = agent.wait_state("a", "READY")["process"]["pid"]
    stand_in.desired = DesiredState(node="test-node", cordoned=True)
    agent.wait_state("a", "STOPPED")
    assert group_alive(first) == []
    metrics = probe.get(f"{agent.url}/metrics").text
    assert 'pitstop_node_cordoned{node="test-node"} 1.0' in metrics
    events = [e for r in stand_in.reports for e in r.events if e.replica == "a"]
    assert ("READY", "DRAINING") in [(e.from_state, e.to_state) for e in events]  # drained, not killed
    wait_until(lambda: any(e.kind == "cordon" for r in stand_in.reports for e in r.events), 5, what="cordon event")
    # Cordoned: nothing starts, not even after a while.
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        assert agent.replica("a")["state"] == "STOPPED", "a cordoned node started a replica"
        time.sleep(0.2)
    stand_in.desired = DesiredState(node="test-node", cordoned=False)
    assert agent.wait_state("a", "READY")["process"]["pid"] != first
    assert agent.replica("b")["state"] == "STOPPED"  # uncordon restores what was wanted, not more
    assert 'pitstop_node_cordoned{node="test-node"} 0.0' in probe.get(f"{agent.url}/metrics").text
