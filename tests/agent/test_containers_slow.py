"""Engines in containers: the agent drives a real Podman through its Docker API (``agent.containers``).

The engine is the simulator, in a container of an image built here (``pitstop/local_podman.py``), on the host's network
as ``network: host`` puts it. Every reason a person would read (the replica's events) is checked in words.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.wire import DesiredState, ReplicaSpec
from bench.harness.http import probe
from pitstop.local_podman import IMAGE, Podman, engine_volumes
from tests.agent.conftest import AgentProcess, ControlPlaneStandIn
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.slow

SIM_ARGS = ["--sim-startup-seconds", "0.5", "--shutdown-timeout", "2"]
NODE = "test-node"


@pytest.fixture(autouse=True)
def no_containers_left(podman: Podman) -> Iterator[None]:
    """Each test starts with no container: one left by a failed test must not take the next one's name."""
    yield
    podman.cli("rm", "--all", "--force", "--time", "0", check=False)


def container_replica(tmp_path: Path, name: str = "r1", **extra: Any) -> dict[str, Any]:
    simgpu = tmp_path / "simgpu"
    simgpu.mkdir(exist_ok=True)
    return {"name": name, "model": "tiny", "port": free_port(), "args": SIM_ARGS, "start_timeout": 60,
            "drain_timeout": 5, "stop_timeout": 5, "warmup": {"requests": 2, "max_tokens": 4},
            "runtime": "container", "image": IMAGE, "pull": "never",
            "volumes": [*engine_volumes(), f"{simgpu}:{simgpu}"], **extra}


def settings(podman: Podman, **extra: Any) -> dict[str, Any]:
    return {"docker_host": podman.docker_host, "container_gpus": "none", **extra}


def engine_pid(agent: AgentProcess, name: str = "r1", other_than: int | None = None) -> int:
    """The host pid of the replica's engine, once the agent has read its process (another than ``other_than``)."""
    def read() -> int:
        return int((agent.replica(name).get("process") or {}).get("pid") or 0)
    wait_until(lambda: read() not in (0, other_than), 30, what="a process reading")
    return read()


def records(tmp_path: Path, name: str = "r1") -> list[dict[str, Any]]:
    """The replica's events, from the journal that keeps them while no control plane takes them."""
    journal = tmp_path / "state" / "run" / f"{name}.events"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def events(tmp_path: Path, name: str = "r1") -> list[str]:
    return [event["message"] for event in records(tmp_path, name)]


def said(tmp_path: Path, words: str, name: str = "r1") -> bool:
    return any(words in message for message in events(tmp_path, name))


def ours(podman: Podman, name: str = "r1") -> list[dict[str, Any]]:
    return podman.containers({"io.pitstop.node": NODE, "io.pitstop.replica": name})


def test_a_container_replica_starts_warms_serves_and_is_removed_when_the_agent_stops(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    spec = container_replica(tmp_path)
    agent = start_agent([spec], **settings(podman))
    agent.wait_state("r1", "READY", timeout=60)
    [container] = ours(podman)
    assert container["Names"] == [f"pitstop-{NODE}-r1-0"] and container["State"] == "running"
    assert container["Labels"]["io.pitstop.generation"] == "0"
    assert json.loads(container["Labels"]["io.pitstop.args"]) == SIM_ARGS
    # The host's pid of the container's engine: what the readings, stack dumps and connection counts read.
    host_pid = int(podman.cli("inspect", "--format", "{{.State.Pid}}", container["Id"]).strip())
    wait_until(lambda: bool((agent.replica("r1").get("process") or {}).get("rss_bytes")), 20,
               what="a process reading")
    reading = agent.replica("r1")["process"]
    assert reading["pid"] == host_pid and reading["rss_bytes"] > 10 * 2**20
    # The container's cgroup, read from the host: of the order of what its processes hold (the host's shared
    # libraries are charged elsewhere); no limit was set, so none is reported.
    assert reading["cgroup_memory_bytes"] >= reading["rss_bytes"] // 2
    assert reading.get("cgroup_memory_limit_bytes") is None
    answer = probe.post(f"http://127.0.0.1:{spec['port']}/v1/completions",
                        json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"]
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=60) == 0
    assert ours(podman) == []  # drained, stopped and removed
    assert said(tmp_path, "stopped (exit code")


def test_a_published_port_serves_on_the_replicas_host_from_the_containers_own_network(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    spec = container_replica(tmp_path, network="published")
    agent = start_agent([spec], **settings(podman))
    agent.wait_state("r1", "READY", timeout=60)  # probed, warmed up and canaried through the published port
    [container] = ours(podman)
    network = json.loads(podman.cli("inspect", "--format", "{{json .HostConfig}}", container["Id"]))
    assert network["NetworkMode"] != "host"
    assert network["PortBindings"][f"{spec['port']}/tcp"] == [{"HostIp": "127.0.0.1", "HostPort": str(spec["port"])}]
    answer = probe.post(f"http://127.0.0.1:{spec['port']}/v1/completions",
                        json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"]


def test_a_crashed_container_backs_off_with_its_exit_and_its_last_lines_then_comes_back(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    agent = start_agent([container_replica(tmp_path)], **settings(podman))
    agent.wait_state("r1", "READY", timeout=60)
    first = engine_pid(agent)
    os.kill(first, signal.SIGKILL)  # what the kernel's OOM killer does
    wait_until(lambda: said(tmp_path, "engine exited while serving (container exited with code 137)"), 20,
               what=f"the exit in the events: {events(tmp_path)}")
    replica = agent.wait_state("r1", "READY", timeout=60)
    assert engine_pid(agent, other_than=first) != first and replica["restarts_total"] == 1
    assert replica["last_exit_code"] == 137
    assert any("Application startup complete" in line for line in replica["log_tail"])
    [container] = ours(podman)  # the crashed one removed, its successor running
    assert container["State"] == "running"


def test_a_killed_agents_container_is_adopted_by_label_and_stale_ones_are_removed(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    spec = container_replica(tmp_path)
    first = start_agent([spec], **settings(podman))
    first.wait_state("r1", "READY", timeout=60)
    engine = engine_pid(first)
    [running] = ours(podman)
    first.proc.kill()  # SIGKILL: the container outlives its agent
    first.proc.wait()
    # A container of an older generation that an agent started and never removed (a host that rebooted).
    podman.cli("create", "--name", f"pitstop-{NODE}-r1-stale", "--label", f"io.pitstop.node={NODE}",
               "--label", "io.pitstop.replica=r1", "--label", "io.pitstop.generation=0", IMAGE, "/bin/true")
    second = start_agent([spec], **settings(podman))
    replica = second.wait_state("r1", "READY", timeout=60)
    # The same engine, serving again: an agent restart restarts no engine and starts no second one.
    assert engine_pid(second) == engine and replica["restarts_total"] == 0
    assert [c["Id"] for c in ours(podman)] == [running["Id"]]
    assert said(tmp_path, f"adopted container pitstop-{NODE}-r1-0 (generation 0)")
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=60) == 0
    assert ours(podman) == []


def test_a_wedged_container_is_taken_out_then_stopped_and_replaced_at_a_new_generation(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path,
        control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    cp, url = control_plane
    spec = container_replica(tmp_path, args=[*SIM_ARGS, "--fault-hang-after", "4"],
                             warmup={"requests": 1, "max_tokens": 2}, drain_timeout=60)
    agent = start_agent([spec], **settings(podman, control_plane=url, canary_timeout=1.0))
    agent.wait_state("r1", "READY", timeout=60)
    old = engine_pid(agent)
    agent.wait_state("r1", "WEDGED", timeout=30)
    assert probe.get(f"{agent.url}/v1/replicas/r1/ready").status_code == 503
    cp.desired = DesiredState(node=NODE, replicas=[
        ReplicaSpec(name="r1", generation=1, engine_args=list(SIM_ARGS), capture_stack=True)])
    fresh = agent.wait_state("r1", "READY", timeout=60)  # well inside the 60 s drain it does not wait for
    assert fresh["generation"] == 1 and engine_pid(agent, other_than=old) != old
    [container] = ours(podman)
    assert container["Names"] == [f"pitstop-{NODE}-r1-1"]
    transitions = [(e.from_state, e.to_state) for r in cp.reports for e in r.events if e.kind == "transition"]
    assert ("READY", "WEDGED") in transitions and ("WEDGED", "STOPPING") in transitions
    assert ("WEDGED", "DRAINING") not in transitions
    assert any(e.kind == "stack_dump" for r in cp.reports for e in r.events)


def test_an_unreachable_daemon_is_a_clear_failure_and_the_agent_stays_up(
        start_agent: Callable[..., AgentProcess], tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path}/no-daemon.sock"
    agent = start_agent([container_replica(tmp_path)], docker_host=nowhere, container_gpus="none")

    def start_failed() -> bool:
        # The start's failure, with its reason: not the note, from before the first start, that no engine left by
        # a previous agent could be looked for (the same words, while the replica is still STOPPED).
        return any(e["kind"] == "transition" and str(e.get("to_state")).upper() == "BACKOFF"
                   and f"no container daemon answers on {nowhere}" in e["message"] for e in records(tmp_path))

    wait_until(start_failed, 20, what=f"the start's failure and its reason in the events: {events(tmp_path)}")
    assert said(tmp_path, "cannot look for an engine left by a previous agent: no container daemon answers")
    assert agent.replica("r1")["state"] in ("BACKOFF", "STARTING", "FATAL")
    assert probe.get(f"{agent.url}/healthz").status_code == 200


@pytest.mark.parametrize(("pull", "words"), [
    ("never", "image localhost/pitstop-absent:1 is not on this host and 'pull' is never"),
    ("missing", "pull of image localhost/pitstop-absent:1 failed"),
])
def test_an_image_that_cannot_be_had_is_a_clear_failure(start_agent: Callable[..., AgentProcess], podman: Podman,
                                                        tmp_path: Path, pull: str, words: str) -> None:
    spec = container_replica(tmp_path, image="localhost/pitstop-absent:1", pull=pull)
    start_agent([spec], **settings(podman))
    wait_until(lambda: said(tmp_path, words), 60, what=f"{words!r} in the events: {events(tmp_path)}")
    assert ours(podman) == []


def test_a_name_taken_by_someone_elses_container_is_refused_and_never_removed(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    name = f"pitstop-{NODE}-r1-0"
    theirs = podman.cli("create", "--name", name, IMAGE, "/bin/true").strip()
    start_agent([container_replica(tmp_path)], **settings(podman))
    wait_until(lambda: said(tmp_path, f"container name {name} is taken by container {theirs[:12]}, which Pitstop "
                                      "did not start"), 30, what=f"the refusal in the events: {events(tmp_path)}")
    assert theirs in podman.cli("ps", "-a", "--format", "{{.ID}} {{.Names}}", "--no-trunc")


def test_a_container_that_exits_while_starting_says_how_with_its_last_lines(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    spec = container_replica(tmp_path, command=["/bin/sh", "-c", "echo 'CUDA out of memory'; exit 3"], args=[])
    agent = start_agent([spec], **settings(podman, backoff={"base": 0.1, "cap": 0.2, "max_failures": 2,
                                                            "window": 60}))
    replica = agent.wait_state("r1", "FATAL", timeout=60)
    assert said(tmp_path, "engine exited while starting (container exited with code 3)"), events(tmp_path)
    assert replica["last_exit_code"] == 3 and "CUDA out of memory" in replica["log_tail"]


def test_the_daemon_going_away_under_a_running_replica_disturbs_nothing_and_is_waited_for(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    spec = container_replica(tmp_path)
    agent = start_agent([spec], **settings(podman, backoff={"base": 0.5, "cap": 1.0, "max_failures": 30,
                                                            "window": 60}))
    agent.wait_state("r1", "READY", timeout=60)
    engine = engine_pid(agent)
    podman.stop_service()
    try:
        served: list[int] = []

        def stream() -> None:
            body = {"model": "tiny", "prompt": "x", "max_tokens": 40, "stream": True}
            with contextlib.suppress(httpx.HTTPError):
                served.append(probe.post(f"http://127.0.0.1:{spec['port']}/v1/completions", json=body,
                                         timeout=30).status_code)

        worker = threading.Thread(target=stream)
        worker.start()
        worker.join(30)
        assert served == [200] and agent.replica("r1")["state"] == "READY"  # the engine serves on, READY
        os.kill(engine, signal.SIGKILL)  # and it dies while no daemon answers: the restart waits for one
        wait_until(lambda: said(tmp_path, "no container daemon answers on"), 30,
                   what=f"the daemon's absence in the events: {events(tmp_path)}")
    finally:
        podman.start_service()
    agent.wait_state("r1", "READY", timeout=60)
    assert engine_pid(agent, other_than=engine) != engine
    assert len(ours(podman)) == 1


def test_a_hung_daemon_holds_back_neither_an_exit_nor_the_agents_stop(
        start_agent: Callable[..., AgentProcess], podman: Podman, tmp_path: Path) -> None:
    """A daemon that accepts connections and never answers (Podman's service frozen with SIGSTOP): an engine's exit
    is still reported at once, and the restart that then waits on the daemon is cancelled by the agent's stop."""
    agent = start_agent([container_replica(tmp_path)], **settings(podman))
    agent.wait_state("r1", "READY", timeout=60)
    engine = engine_pid(agent)
    assert podman.service is not None
    os.kill(podman.service.pid, signal.SIGSTOP)
    try:
        os.kill(engine, signal.SIGKILL)
        wait_until(lambda: said(tmp_path, "container exited; its exit code is unknown (the daemon did not say)"), 30,
                   what=f"the exit in the events: {events(tmp_path)}")
        agent.wait_state("r1", "STARTING", timeout=30)  # the restart, waiting on the daemon
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=60) == 0
        # Cancelled by the stop: a start left to wait out the daemon's timeout would have failed instead ("did not
        # answer ... in time") and backed off.
        assert said(tmp_path, "start interrupted"), events(tmp_path)
        assert not said(tmp_path, "in time"), events(tmp_path)
    finally:
        os.kill(podman.service.pid, signal.SIGCONT)
