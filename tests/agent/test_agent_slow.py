"""The agent as a real process supervising simulated vLLM engines (``pitstop sim serve``) on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from agent.wire import DesiredState, ReplicaSpec
from bench.harness.http import probe
from tests.agent.conftest import AgentProcess, ControlPlaneStandIn, group_alive
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.slow

SIM_ARGS = ["--sim-startup-seconds", "0.5", "--shutdown-timeout", "2"]


def sim_replica(name: str = "r1", **extra: Any) -> dict[str, Any]:
    return {"name": name, "model": "tiny", "port": free_port(), "args": SIM_ARGS, "start_timeout": 30,
            "drain_timeout": 5, "stop_timeout": 5, "warmup": {"requests": 2, "max_tokens": 4}, **extra}


def test_replica_becomes_ready_and_is_observed(start_agent: Callable[..., AgentProcess]) -> None:
    agent = start_agent([sim_replica()])
    replica = agent.wait_state("r1", "READY")
    assert probe.get(f"{agent.url}/v1/replicas/r1/ready").status_code == 200
    assert probe.get(f"{agent.url}/v1/replicas/nope/ready").status_code == 404
    # The engine runs in its own process group, on the configured GPU.
    pid = replica["process"]["pid"]
    assert os.getpgid(pid) == pid
    assert psutil.Process(pid).environ()["CUDA_VISIBLE_DEVICES"] == "0"
    # The two warmup requests of 4 tokens, in a scrape: the one at READY may have been taken between them.
    wait_until(lambda: ((agent.replica("r1").get("engine") or {}).get("generation_tokens_total") or 0) >= 8, 10,
               what="an engine scrape counting the warmup's tokens")
    r = agent.replica("r1")
    assert r["process"]["rss_bytes"] > 0
    metrics = probe.get(f"{agent.url}/metrics").text
    assert ('pitstop_replica_state{engine="vllm",model="tiny",node="test-node",replica="r1",state="READY"} 1.0'
            in metrics)


def test_kill_9_of_the_engine_backs_off_then_recovers(start_agent: Callable[..., AgentProcess]) -> None:
    agent = start_agent([sim_replica()])
    first = agent.wait_state("r1", "READY")["process"]["pid"]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: agent.replica("r1")["state"] in ("BACKOFF", "STARTING", "WARMING"), 10, what="failure")
    replica = agent.wait_state("r1", "READY")
    assert replica["process"]["pid"] != first
    assert replica["restarts_total"] == 1
    assert replica["last_exit_code"] == -9
    assert any("Application startup complete" in line for line in replica["log_tail"])


def test_an_engine_that_exits_0_is_a_failure_and_goes_fatal(start_agent: Callable[..., AgentProcess]) -> None:
    # Real vLLM exits 0 when its EngineCore dies: exit code 0 must not read as a clean stop.
    quitter = {"name": "quitter", "model": "tiny", "port": free_port(),
               "command": [sys.executable, "-c", "print('engine core died'); raise SystemExit(0)"]}
    agent = start_agent([quitter], backoff={"base": 0.1, "cap": 0.2, "max_failures": 3, "window": 60})
    replica = agent.wait_state("quitter", "FATAL", timeout=20)
    assert replica["last_exit_code"] == 0
    assert replica["restarts_total"] == 2
    assert "engine core died" in replica["log_tail"]
    assert probe.get(f"{agent.url}/v1/replicas/quitter/ready").status_code == 503


def test_agent_shutdown_stops_every_engine(start_agent: Callable[..., AgentProcess]) -> None:
    agent = start_agent([sim_replica("a"), sim_replica("b")])
    pids = [agent.wait_state(n, "READY")["process"]["pid"] for n in ("a", "b")]
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=30) == 0
    for pid in pids:
        assert group_alive(pid) == [], f"engine group {pid} survived the agent"


def test_reports_and_desired_generation_restart_with_new_args(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, url = control_plane
    agent = start_agent([sim_replica()], control_plane=url, token="t0k")
    agent.wait_state("r1", "READY")
    wait_until(lambda: len(stand_in.reports) >= 2, 10, what="two reports")
    sequences = [r.sequence for r in stand_in.reports]
    assert sequences == sorted(set(sequences))
    assert stand_in.auth[0] == "Bearer t0k"

    def transitions() -> list[tuple[str | None, str | None]]:
        return [(e.from_state, e.to_state) for r in stand_in.reports for e in r.events if e.replica == "r1"]

    wait_until(lambda: ("WARMING", "READY") in transitions(), 10, what="the READY event reported")
    assert transitions()[0] == ("STOPPED", "STARTING")

    old_pid = agent.replica("r1")["process"]["pid"]
    new_args = [*SIM_ARGS, "--max-num-seqs", "32"]
    stand_in.desired = DesiredState(node="test-node", replicas=[ReplicaSpec(name="r1", generation=1,
                                                                            engine_args=new_args)])
    wait_until(lambda: agent.replica("r1")["generation"] == 1 and agent.replica("r1")["state"] == "READY", 30,
               what="generation 1 READY")
    replica = agent.replica("r1")
    assert replica["engine_args"] == new_args
    assert "32" in psutil.Process(replica["process"]["pid"]).cmdline()
    assert group_alive(old_pid) == []
    wait_until(lambda: {"DRAINING", "STOPPING", "STOPPED"} <= {str(t) for _, t in transitions()}, 10,
               what="drain and stop events reported")
    wait_until(lambda: any(r.replicas and r.replicas[0].generation == 1 for r in stand_in.reports), 10,
               what="generation 1 reported")

    # enabled: false -> drain and stop; the whole process group is gone.
    pid = replica["process"]["pid"]
    stand_in.desired = DesiredState(node="test-node", replicas=[ReplicaSpec(name="r1", generation=1,
                                                                            engine_args=new_args, enabled=False)])
    agent.wait_state("r1", "STOPPED")
    assert group_alive(pid) == []
    assert probe.get(f"{agent.url}/v1/replicas/r1/ready").status_code == 503


def test_control_plane_away_keeps_supervising(start_agent: Callable[..., AgentProcess]) -> None:
    agent = start_agent([sim_replica()], control_plane=f"http://127.0.0.1:{free_port()}")
    agent.wait_state("r1", "READY")
    assert agent.output().count("control plane unreachable") == 1  # once per outage, not per attempt


def long_stream(agent: AgentProcess, port: int, max_tokens: int) -> tuple[threading.Thread, dict[str, Any]]:
    """A streaming completion in a thread, running on the engine when this returns; its data lines land in
    the dict's ``lines`` once it ends."""
    result: dict[str, Any] = {}

    def stream() -> None:
        body = {"model": "tiny", "prompt": "tell me", "max_tokens": max_tokens, "stream": True}
        with probe.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30) as response:
            result["lines"] = [line for line in response.iter_lines() if line.startswith("data:")]

    streamer = threading.Thread(target=stream)
    streamer.start()
    wait_until(lambda: (agent.replica("r1").get("engine") or {}).get("requests_running", 0) > 0, 10,
               what="the request to be running")
    return streamer, result


def test_drain_lets_in_flight_requests_finish_before_the_stop(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, url = control_plane
    spec = sim_replica(drain_timeout=60)
    agent = start_agent([spec], control_plane=url)
    pid = agent.wait_state("r1", "READY")["process"]["pid"]
    # About 15 s when warm: still streaming when the agent, however loaded the host, reaches DRAINING.
    streamer, result = long_stream(agent, spec["port"], max_tokens=1500)
    try:
        stand_in.desired = DesiredState(node="test-node", replicas=[ReplicaSpec(name="r1", generation=0,
                                                                                engine_args=SIM_ARGS, enabled=False)])
        agent.wait_state("r1", "DRAINING", timeout=10)
        assert probe.get(f"{agent.url}/v1/replicas/r1/ready").status_code == 503  # readiness off first
        assert streamer.is_alive()  # still streaming while draining
    finally:
        streamer.join(timeout=90)
    agent.wait_state("r1", "STOPPED", timeout=30)
    assert result["lines"][-1] == "data: [DONE]"  # the in-flight request was not aborted
    assert group_alive(pid) == []


def test_a_new_agent_adopts_the_engine_a_killed_agent_left(start_agent: Callable[..., AgentProcess]) -> None:
    spec = sim_replica()
    first = start_agent([spec])
    engine = first.wait_state("r1", "READY")["process"]["pid"]
    first.proc.kill()  # SIGKILL: the agent cannot stop its engine
    first.proc.wait()
    assert group_alive(engine), "the engine should have outlived a SIGKILLed agent"
    second = start_agent([spec])
    replica = second.wait_state("r1", "READY")
    # The same engine, serving again (read as this agent's once its next pass samples the adopted pid): an agent
    # restart restarts no engine, and the engine it is about to adopt is never reported as an orphan on its GPU.
    wait_until(lambda: (second.replica("r1").get("process") or {}).get("pid") == engine, 10, what="the adopted pid")
    assert replica["restarts_total"] == 0
    assert "not started by this agent" not in second.output()
    assert group_alive(engine)
    second.proc.send_signal(signal.SIGTERM)  # and it is this agent's to stop
    assert second.proc.wait(timeout=30) == 0
    assert group_alive(engine) == []


def test_an_engine_spawned_just_before_its_agent_was_killed_is_found_by_its_mark_and_adopted(
        start_agent: Callable[..., AgentProcess], tmp_path: Any) -> None:
    """An agent killed between the spawn and writing the pid leaves only the announcement: the engine's mark."""
    spec = sim_replica()
    first = start_agent([spec])
    engine = first.wait_state("r1", "READY")["process"]["pid"]
    first.proc.kill()
    first.proc.wait()
    record_path = tmp_path / "state" / "run" / "r1.pid"
    record = json.loads(record_path.read_text())
    assert record["mark"] and psutil.Process(engine).environ()["PITSTOP_ENGINE_MARK"] == record["mark"]
    # What the disk holds when the kill lands inside the spawn: what is started, and how to know it; no pid.
    record_path.write_text(json.dumps({k: record[k] for k in ("generation", "args", "mark")}))
    second = start_agent([spec])
    replica = second.wait_state("r1", "READY")
    # Adopted, not doubled: a second engine on the port would fail to bind and its probes reach the first.
    wait_until(lambda: (second.replica("r1").get("process") or {}).get("pid") == engine, 10,
               what=f"the adopted pid\n{second.output()}")
    assert replica["restarts_total"] == 0, second.output()
    assert json.loads(record_path.read_text())["pid"] == engine  # and written down this time
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=30) == 0
    assert group_alive(engine) == []


def test_an_engine_left_while_draining_is_adopted_drained_and_replaced(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, url = control_plane
    spec = sim_replica(drain_timeout=20)
    first = start_agent([spec], control_plane=url)
    old = first.wait_state("r1", "READY")["process"]["pid"]
    streamer, result = long_stream(first, spec["port"], max_tokens=400)  # ~4 s when warm
    try:
        stand_in.desired = DesiredState(node="test-node", replicas=[ReplicaSpec(name="r1", generation=1,
                                                                                engine_args=SIM_ARGS)])
        first.wait_state("r1", "DRAINING", timeout=10)
        first.proc.kill()  # mid-drain: the new generation is saved, the old engine still streams
        first.proc.wait()
        reported = len(stand_in.reports)
        second = start_agent([spec], control_plane=url)
        fresh = second.wait_state("r1", "READY", timeout=40)
    finally:
        streamer.join(timeout=30)
    assert fresh["generation"] == 1 and fresh["process"]["pid"] != old
    assert group_alive(old) == []
    assert result["lines"][-1] == "data: [DONE]"  # drained by the new agent: what it streamed finished
    moves = [(e.from_state, e.to_state) for r in stand_in.reports[reported:] for e in r.events
             if e.kind == "transition"]
    adopted = moves.index(("STOPPED", "STARTING"))
    assert moves[adopted:adopted + 4] == [("STOPPED", "STARTING"), ("STARTING", "DRAINING"),
                                          ("DRAINING", "STOPPING"), ("STOPPING", "STOPPED")], moves
    assert ("READY", "DRAINING") in moves[:adopted]  # what the killed agent had not reported, sent by the next


def test_canary_measures_ttft(start_agent: Callable[..., AgentProcess]) -> None:
    agent = start_agent([sim_replica()], canary_every=1)
    agent.wait_state("r1", "READY")
    wait_until(lambda: agent.replica("r1")["canary_ok"] is True, 10, what="a canary")
    assert 0 < agent.replica("r1")["canary_ttft_seconds"] < 5


@pytest.mark.parametrize("gauges", ["zero", "last"])
def test_a_wedged_engine_reads_healthy_but_the_agent_takes_it_out_of_rotation(
        start_agent: Callable[..., AgentProcess], gauges: str) -> None:
    # vLLM #39863: a hung EngineCore keeps /health at 200 and its gauges read 0 (or freeze); the canary and
    # the flat token counter are the signals, and the agent acts on them alone (no control plane here).
    spec = sim_replica(args=[*SIM_ARGS, "--fault-hang-after", "4", "--fault-hang-gauges", gauges],
                       warmup={"requests": 1, "max_tokens": 2})
    agent = start_agent([spec], canary_timeout=1.0)  # canary_every and wedge_canaries at their defaults

    def send() -> None:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 5000, "ignore_eos": True}
        with contextlib.suppress(httpx.HTTPError):
            probe.post(f"http://127.0.0.1:{spec['port']}/v1/completions", json=body, timeout=30)

    agent.wait_state("r1", "READY")
    threading.Thread(target=send, daemon=True).start()  # in flight when the engine wedges
    wedged = agent.wait_state("r1", "WEDGED", timeout=20)
    assert wedged["ready"] is False and wedged["canary_ok"] is False
    assert probe.get(f"{agent.url}/v1/replicas/r1/ready").status_code == 503
    assert probe.get(f"http://127.0.0.1:{spec['port']}/health").status_code == 200
    metrics = probe.get(f"{agent.url}/metrics").text
    assert ('pitstop_replica_state{engine="vllm",model="tiny",node="test-node",replica="r1",state="WEDGED"} 1.0'
            in metrics)
    time.sleep(3)  # it stays out: only a restart brings it back
    assert agent.replica("r1")["state"] == "WEDGED"


def test_a_wedged_engine_is_stopped_without_a_drain_and_comes_back_at_a_new_generation(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    cp, url = control_plane
    spec = sim_replica(args=[*SIM_ARGS, "--fault-hang-after", "4"], warmup={"requests": 1, "max_tokens": 2},
                       drain_timeout=60)
    agent = start_agent([spec], control_plane=url, canary_timeout=1.0)
    old_pid = agent.wait_state("r1", "READY")["process"]["pid"]
    agent.wait_state("r1", "WEDGED", timeout=20)
    cp.desired = DesiredState(node="test-node", replicas=[
        ReplicaSpec(name="r1", generation=1, engine_args=list(SIM_ARGS), capture_stack=True)])
    fresh = agent.wait_state("r1", "READY", timeout=30)  # well inside the 60 s drain it does not wait for
    wait_until(lambda: any(e.to_state == "READY" for r in cp.reports[-5:] for e in r.events) or
               any(r.replicas and r.replicas[0].generation == 1 for r in cp.reports), 10, what="reported")
    assert fresh["generation"] == 1 and fresh["process"]["pid"] != old_pid
    assert group_alive(old_pid) == []
    transitions = [(e.from_state, e.to_state) for r in cp.reports for e in r.events if e.kind == "transition"]
    assert ("READY", "WEDGED") in transitions and ("WEDGED", "STOPPING") in transitions
    assert ("WEDGED", "DRAINING") not in transitions
    assert any(e.kind == "stack_dump" for r in cp.reports for e in r.events)


def test_start_deadline_is_a_failure_and_the_silent_engine_is_killed(
        start_agent: Callable[..., AgentProcess]) -> None:
    silent = {"name": "silent", "model": "tiny", "port": free_port(), "start_timeout": 1,
              "command": [sys.executable, "-c", "import time; print('loading forever', flush=True); time.sleep(600)"]}
    agent = start_agent([silent], backoff={"base": 30, "cap": 30})
    wait_until(lambda: agent.replica("silent")["state"] == "BACKOFF", 15, what="BACKOFF")
    replica = agent.replica("silent")
    assert replica["log_tail"] == ["loading forever"]
    assert replica["last_exit_code"] == -9
    assert psutil.Process(agent.proc.pid).children(recursive=True) == []  # the silent engine was killed


def test_attached_engine_is_watched_never_started(start_agent: Callable[..., AgentProcess], tmp_path: Any) -> None:
    port = free_port()
    engine = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "sim", "serve", "ext", "--port", str(port),
                               *SIM_ARGS, "--sim-gpu-dir", str(tmp_path / "g")], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        agent = start_agent([{"name": "ext", "model": "ext", "url": f"http://127.0.0.1:{port}"}])
        replica = agent.wait_state("ext", "ATTACHED", timeout=20)
        assert replica["managed"] is False and replica["ready"] is True
        wait_until(lambda: (agent.replica("ext").get("engine") or {}).get("generation_tokens_total") is not None,
                   10, what="a scrape of the attached engine")
        engine.kill()
        engine.wait()
        agent.wait_state("ext", "UNREACHABLE", timeout=10)
        assert probe.get(f"{agent.url}/v1/replicas/ext/ready").status_code == 503
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()


def test_a_wedged_engines_canary_does_not_hold_back_the_other_replicas(
        start_agent: Callable[..., AgentProcess], tmp_path: Path) -> None:
    # The canary to a wedged engine waits out its whole timeout; the node's other signals must keep flowing.
    # r1 hangs when the test writes its fault clock, once both replicas are READY, however long start-up took.
    clock = tmp_path / "fault-clock"
    wedged = sim_replica("r1", args=[*SIM_ARGS, "--fault-hang-after", "0", "--fault-clock-file", str(clock)],
                         warmup={"requests": 1, "max_tokens": 2})
    healthy = sim_replica("r2", gpus=[1])
    agent = start_agent([wedged, healthy], canary_every=1, canary_timeout=30.0, sim_gpu_count=2)
    agent.wait_state("r1", "READY")
    agent.wait_state("r2", "READY")
    clock.write_text(f"{time.time()}")
    engine_log = tmp_path / "state" / "logs" / "r1.log"
    wait_until(lambda: "injected fault: hang" in engine_log.read_text(errors="replace"), 20,
               what="r1's engine to hang")  # from now on r1's canary waits on an engine that never answers
    seen: set[float] = set()

    def fresh_canaries() -> bool:
        ttft = agent.replica("r2").get("canary_ttft_seconds")
        if ttft is not None:
            seen.add(ttft)
        return len(seen) >= 4

    wait_until(fresh_canaries, 10, what="r2's canary to keep reporting while r1's hangs")
    assert agent.replica("r1")["canary_ok"] is not False  # still waiting: its 30 s timeout has not passed


def test_an_attached_engine_that_wedges_loses_readiness_only(start_agent: Callable[..., AgentProcess],
                                                               tmp_path: Any) -> None:
    # Not the agent's to restart: readiness off while it makes no progress, and it is never touched.
    port = free_port()
    engine = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "sim", "serve", "ext", "--port", str(port),
                               *SIM_ARGS, "--fault-hang-after", "4", "--sim-gpu-dir", str(tmp_path / "g")],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        agent = start_agent([{"name": "ext", "model": "ext", "url": f"http://127.0.0.1:{port}"}],
                            canary_timeout=1.0)
        agent.wait_state("ext", "ATTACHED", timeout=20)
        wait_until(lambda: agent.replica("ext")["ready"] is False, 20, what="readiness off for the wedged engine")
        replica = agent.replica("ext")
        assert replica["state"] == "ATTACHED" and replica["canary_ok"] is False
        assert probe.get(f"{agent.url}/v1/replicas/ext/ready").status_code == 503
        assert engine.poll() is None  # still running: only watched
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()
