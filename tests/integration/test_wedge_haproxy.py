"""A wedge behind a real HAProxy: once the agent takes the wedged replica's readiness off, no new request fails.

Two simulated replicas behind HAProxy, which health-checks the agent's ``/v1/replicas/<name>/ready``
(``bench.harness.haproxy``: inter 500 ms, fall 1). Steady streaming load goes through HAProxy; one replica
wedges as vLLM does (``--fault-hang-gauges zero``: the API accepts requests and never answers them, the gauges
read 0, /health stays 200). The agent runs standalone, with its default canary settings: taking the replica
out of rotation is its own job. Requests sent before HAProxy saw the replica down may be lost with it (they
are counted and printed); every request sent after must succeed.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from bench.harness.haproxy import HAProxy
from bench.harness.http import probe
from bench.harness.procs import Processes
from tests.helpers import free_port, http_ok, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                       reason="needs Debian's haproxy"),
]

HANG_AFTER = 12.0  # seconds after the engine listens: past start, warmup and a steady load
CLIENT_TIMEOUT = 20.0


@dataclass(frozen=True)
class Outcome:
    started: float
    ok: bool
    error: str | None


def _client(url: str, stop: threading.Event, out: list[Outcome]) -> None:
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 16, "stream": True}
    while not stop.is_set():
        started = time.monotonic()
        ok, error = False, None
        try:
            with probe.stream("POST", f"{url}/v1/completions", json=body, timeout=CLIENT_TIMEOUT) as response:
                lines = list(response.iter_lines()) if response.status_code == 200 else []
                ok = "data: [DONE]" in lines
                error = None if ok else f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        out.append(Outcome(started, ok, error))


def test_a_wedged_replica_leaves_haproxy_and_no_new_request_fails(tmp_path: Path) -> None:
    agent_port = free_port()
    engines = {"good": free_port(), "wedged": free_port()}
    sim = ["--sim-startup-seconds", "0.5", "--shutdown-timeout", "2", "--sim-gpu-dir", str(tmp_path / "simgpu")]
    replicas = [
        {"name": name, "model": "tiny", "port": port, "gpus": [i], "start_timeout": 30, "stop_timeout": 5,
         "args": sim + (["--fault-hang-after", f"{HANG_AFTER:g}", "--fault-hang-gauges", "zero"]
                        if name == "wedged" else [])}
        for i, (name, port) in enumerate(engines.items())]
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "lb-node", "port": agent_port, "control_plane": None, "gpu_backend": "sim", "sim_gpu_count": 2,
        "sim_gpu_dir": str(tmp_path / "simgpu"), "state_dir": str(tmp_path / "state"), "scrape_interval": 1,
        "replicas": replicas}))
    agent = f"http://127.0.0.1:{agent_port}"
    with Processes(tmp_path / "logs") as processes:
        processes.start("agent", "agent", "--config", str(config))
        for name in engines:
            wait_until(lambda n=name: http_ok(f"{agent}/v1/replicas/{n}/ready"), 60, what=f"{name} READY")
        haproxy = HAProxy(tmp_path / "haproxy", processes, agent_port=agent_port, engines=engines)
        wait_until(lambda: haproxy.servers_up() == 2, 20, what="both servers UP in HAProxy")

        stop = threading.Event()
        outcomes: list[Outcome] = []
        clients = [threading.Thread(target=_client, args=(haproxy.url, stop, outcomes), daemon=True)
                   for _ in range(4)]
        for t in clients:
            t.start()
        wait_until(lambda: http_ok(f"{agent}/v1/replicas/wedged/ready") is False, HANG_AFTER + 30, interval=0.1,
                   what=f"the wedged replica's readiness off\n{processes.log('agent')[-3000:]}")
        ready_off = time.monotonic()
        wait_until(lambda: haproxy.servers_up() == 1, 10, interval=0.05, what="HAProxy taking it out")
        lb_off = time.monotonic()
        state = probe.get(f"{agent}/v1/replicas/wedged", timeout=5).json()["state"]
        time.sleep(CLIENT_TIMEOUT + 5)  # long enough for a request sent after to fail, if it were to
        stop.set()
        for t in clients:
            t.join(timeout=CLIENT_TIMEOUT + 10)

    assert state == "WEDGED"
    after = [o for o in outcomes if o.started >= lb_off]
    lost = [o for o in outcomes if o.started < lb_off and not o.ok]
    assert len(after) > 20, "the load did not keep going after the wedge"
    assert [o for o in after if not o.ok] == [], "a request sent after readiness went off failed"
    print(f"HAProxy took the wedged replica out {lb_off - ready_off:.2f} s after its readiness went off; "
          f"{len(lost)} request(s) lost with the wedged engine; "
          f"{len(after)} sent after, all answered", file=sys.stderr)
