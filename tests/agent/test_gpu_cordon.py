"""A GPU cordon drains and keeps stopped only the replicas on that GPU; the rest of the node keeps serving."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agent.wire import DesiredState
from bench.harness.http import probe
from tests.agent.conftest import AgentProcess, ControlPlaneStandIn
from tests.agent.test_agent_slow import sim_replica
from tests.helpers import wait_until


@pytest.mark.slow
def test_cordoning_gpu_1_drains_only_its_replica_and_uncordoning_brings_it_back(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, url = control_plane
    agent = start_agent([sim_replica("a", gpus=[0]), sim_replica("b", gpus=[1])], control_plane=url,
                        sim_gpu_count=2)
    a_pid = agent.wait_state("a", "READY")["process"]["pid"]
    b_pid = agent.wait_state("b", "READY")["process"]["pid"]
    stand_in.desired = DesiredState(node="test-node", cordoned_gpus=[1])
    agent.wait_state("b", "STOPPED")
    events = [e for r in stand_in.reports for e in r.events if e.replica == "b"]
    assert ("READY", "DRAINING") in [(e.from_state, e.to_state) for e in events]  # drained, not killed
    metrics = probe.get(f"{agent.url}/metrics").text
    assert 'pitstop_gpu_cordoned{gpu="1",node="test-node"} 1.0' in metrics
    assert 'pitstop_gpu_cordoned{gpu="0",node="test-node"} 0.0' in metrics
    assert 'pitstop_node_cordoned{node="test-node"} 0.0' in metrics
    wait_until(lambda: {g.index: g.cordoned for g in stand_in.reports[-1].gpus} == {0: False, 1: True}, 5,
               what="the report marks GPU 1 cordoned")
    # Kept stopped while cordoned; the replica on GPU 0 never noticed.
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        assert agent.replica("b")["state"] == "STOPPED", "a replica on a cordoned GPU started"
        time.sleep(0.2)
    a = agent.replica("a")
    assert (a["state"], a["process"]["pid"]) == ("READY", a_pid)
    stand_in.desired = DesiredState(node="test-node")
    assert agent.wait_state("b", "READY")["process"]["pid"] != b_pid
    assert 'pitstop_gpu_cordoned{gpu="1",node="test-node"} 0.0' in probe.get(f"{agent.url}/metrics").text
    assert any(e.kind == "cordon" and "GPU 1 uncordoned" in e.message
               for r in stand_in.reports for e in r.events if e.replica == "b")
