"""End to end: past the max-num-seqs floor, the itl-slo governor's first flag rung is canaried and rolled.

A real ``pitstop server`` (SQLite) and a real ``pitstop agent`` run two simulated tensor-parallel engines of
one model (``--tensor-parallel-size 2`` on GPUs 0,1 and 2,3), both already at the policy's max-num-seqs floor,
both on a host whose custom all-reduce is slow (``--fault-slow-all-reduce-ms``: every step pays it until the
engine runs with ``--disable-custom-all-reduce``). Under steady load behind a least-connections balancer that
follows the agent's readiness endpoints, the SRE must see, through the control plane's API: one
``add_engine_flag`` action for ``--disable-custom-all-reduce`` on one replica, its canary passing with an ITL
far below its like-for-like peer's, the flag rolled to that peer, both READY at new generations, never both
out of service at once, and no request of the load failed.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.harness.http import probe
from tests.helpers import free_port, http_ok, wait_until
from tests.integration.conftest import Processes

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[2] / "controlplane/policy/defaults/itl-slo.yaml"
ALL_REDUCE = "--disable-custom-all-reduce"
FLOOR = 16
# 150 ms more per step puts every inter-token gap near 0.16 s (the (0.15, 0.2] bucket, p99 ~0.2 s) with the
# custom all-reduce, and near 0.013 s (p99 ~0.025 s) with NCCL: 0.1 s sits clearly between the two.
SLOW_ALL_REDUCE_MS = 150
THRESHOLD = 0.1
CANARY_WINDOW = 20
OUT_OF_SERVICE = {"STARTING", "WARMING", "DRAINING", "STOPPING", "STOPPED", "BACKOFF", "FATAL"}


def _policy() -> dict[str, Any]:
    """The shipped itl-slo, made quick: a 5 s breach, the floor at the engines' value, a short cooldown.

    The shipped share of breaching readings (10 %) is for its minute: a 5 s window holds about five readings,
    so there one reading would be a breach. One late step of a simulated engine on a busy host reads so (a
    0.27 s reading between 0.025 s ones, after the flag was rolled, proposed the next rung); the slow
    all-reduce breaches in every reading. So here a breach is half the window's readings."""
    policy: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    policy["condition"].update({"threshold": THRESHOLD, "for": "5s", "min_share": 0.5})
    policy["action"]["min"] = FLOOR
    policy["guardrails"] = {"cooldown": "10s", "max_disruptions_per_hour": 20}
    return policy


def _start(tmp: Path, processes: Processes) -> tuple[str, str, dict[str, int]]:
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "itl-slo.yaml").write_text(yaml.safe_dump(_policy()))
    cp_port, agent_port = free_port(), free_port()
    ports = {"r0": free_port(), "r1": free_port()}
    server = tmp / "server.yaml"
    server.write_text(yaml.safe_dump({
        "port": cp_port, "database_url": f"sqlite:///{tmp / 'cp.db'}", "policy_defaults": False,
        "policy_dirs": [str(policies)], "policy_interval_seconds": 1, "executor_interval_seconds": 0.5,
        "action_deadline_seconds": 90, "canary_window_seconds": CANARY_WINDOW}))
    processes.start("server", "server", "--config", str(server))
    cp = f"http://127.0.0.1:{cp_port}"
    wait_until(lambda: http_ok(f"{cp}/healthz"), 60, what="the control plane")
    args = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp / "simgpu"), "--max-num-seqs", str(FLOOR),
            "--tensor-parallel-size", "2", "--fault-slow-all-reduce-ms", str(SLOW_ALL_REDUCE_MS)]
    replica = {"model": "tiny", "args": args, "stop_timeout": 10, "drain_timeout": 20, "drain_grace": 3,
               "shutdown_timeout": 10, "warmup": {"requests": 1, "settle_count": 0, "max_tokens": 2}}
    agent_config = tmp / "agent.yaml"
    agent_config.write_text(yaml.safe_dump({
        "node": "e2e", "port": agent_port, "control_plane": cp, "report_interval": 1, "scrape_interval": 0.5,
        "gpu_backend": "sim", "sim_gpu_count": 4, "sim_gpu_dir": str(tmp / "simgpu"),
        "state_dir": str(tmp / "agent-state"),
        "replicas": [{**replica, "name": "r0", "port": ports["r0"], "gpus": [0, 1]},
                     {**replica, "name": "r1", "port": ports["r1"], "gpus": [2, 3]}],
    }))
    processes.start("agent", "agent", "--config", str(agent_config))
    agent = f"http://127.0.0.1:{agent_port}"
    wait_until(lambda: http_ok(f"{agent}/healthz"), 60, what="the agent")
    return cp, agent, ports


class ReplicaWatch:
    """Polls the agent's own view of its replicas (what a balancer's health checks see), and remembers every
    moment more than one replica was out of service."""

    def __init__(self, agent: str, every: float = 0.2) -> None:
        self.agent, self.every = agent, every
        self.latest: dict[str, dict[str, Any]] = {}
        self.both_out: list[dict[str, str]] = []
        self.armed = False  # set once every replica has been READY: both start together, as they should
        self.seen_out: set[str] = set()  # replicas seen out of service since (each restart shows here)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.wait(self.every):
                try:
                    rows = client.get(f"{self.agent}/v1/replicas").json()
                except (httpx.HTTPError, ValueError):
                    continue
                self.latest = {r["name"]: r for r in rows}
                out = {r["name"]: r["state"] for r in rows if r["state"] in OUT_OF_SERVICE or not r["ready"]}
                if self.armed:
                    self.seen_out.update(out)
                    if len(out) > 1:
                        self.both_out.append(out)

    def ready(self) -> list[str]:
        return sorted(name for name, r in self.latest.items() if r["ready"] and r["state"] == "READY")

    def __enter__(self) -> ReplicaWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


class LeastConnLoad:
    """Closed-loop clients behind a least-connections balancer over the READY replicas; counts every outcome.

    As HAProxy's ``leastconn`` does, a faster engine (it frees its connections sooner) gets more of the load.
    """

    def __init__(self, watch: ReplicaWatch, ports: dict[str, int], clients: int = 4, max_tokens: int = 8) -> None:
        self.watch, self.ports, self.max_tokens = watch, ports, max_tokens
        self.lock = threading.Lock()
        self.in_flight: Counter[str] = Counter()
        self.ok: Counter[str] = Counter()
        self.failures: list[str] = []
        self.unserved = 0  # moments with no READY replica: a balancer would have answered 503
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _pick(self, rng: random.Random) -> str | None:
        ready = self.watch.ready()
        with self.lock:
            if not ready:
                return None
            least = min(self.in_flight[n] for n in ready)
            name = rng.choice([n for n in ready if self.in_flight[n] == least])
            self.in_flight[name] += 1
            return name

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        body = {"model": "tiny", "prompt": "hello", "max_tokens": self.max_tokens}
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                name = self._pick(rng)
                if name is None:
                    self.unserved += 1
                    time.sleep(0.1)
                    continue
                try:
                    r = client.post(f"http://127.0.0.1:{self.ports[name]}/v1/completions", json=body)
                    outcome = "ok" if r.status_code == 200 and r.json().get("choices") else f"HTTP {r.status_code}"
                except (httpx.HTTPError, ValueError) as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    self.in_flight[name] -= 1
                    if outcome == "ok":
                        self.ok[name] += 1
                    else:
                        self.failures.append(f"{name} at {time.strftime('%H:%M:%S')}: {outcome}")

    def __enter__(self) -> LeastConnLoad:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def _get(url: str, **params: Any) -> Any:
    try:
        return probe.get(url, params=params, timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None


def _rungs(cp: str) -> list[dict[str, Any]]:
    rows = _get(f"{cp}/v1/actions", policy="itl-slo") or []
    return [a for a in rows if a["kind"] == "add_engine_flag"]


def test_past_the_floor_the_all_reduce_rung_is_canaried_and_rolled_without_dropping_a_request(
        tmp_path: Path) -> None:
    processes = Processes(tmp_path / "logs")
    try:
        cp, agent, ports = _start(tmp_path, processes)
        with ReplicaWatch(agent) as watch:
            wait_until(lambda: watch.ready() == ["r0", "r1"], 60, what="both replicas READY")
            first = {n: r["generation"] for n, r in watch.latest.items()}
            watch.armed = True
            with LeastConnLoad(watch, ports) as load:
                wait_until(lambda: _rungs(cp) != [], 60, interval=0.5, what="the flag rung proposed")
                [rung] = _rungs(cp)
                wait_until(lambda: (_get(f"{cp}/v1/actions/{rung['id']}") or {}).get("state")
                           in ("succeeded", "failed", "rolled_back"), 150, interval=0.5, what="the rung's outcome")

                def both_rolled() -> bool:
                    rows = {r["name"]: r for r in _get(f"{cp}/v1/replicas", node="e2e") or []}
                    return len(rows) == 2 and all(r["state"] == "READY" and r["engine_args"][-1:] == [ALL_REDUCE]
                                                  for r in rows.values())

                wait_until(both_rolled, 30, interval=0.5, what="both replicas READY with the flag in the API")
            assert watch.seen_out == {"r0", "r1"}, "each restart seen by the watch"
            assert not watch.both_out, f"both replicas out of service at once: {watch.both_out[:5]}"
            on_node = dict(watch.latest)
        done = _get(f"{cp}/v1/actions/{rung['id']}")
        server_log = processes.log("server")[-3000:]
        assert done["state"] == "succeeded", (done, server_log)
        assert [a["id"] for a in _rungs(cp)] == [rung["id"]], "one rung, on one canary, then rolled"
        canary = done["replicas"][0].split("/")[1]
        peer = ({"r0", "r1"} - {canary}).pop()
        assert done["target"] == f"replica:e2e/{canary}" and done["replicas"] == [f"e2e/{canary}"]
        assert done["params"]["flag"] == ALL_REDUCE and done["params"]["canary"] is True
        assert f"floor {FLOOR}" in done["reason"], done["reason"]
        plan = done["params"]["rollout"]
        verdict = plan["canary_verdict"]
        assert verdict["verdict"] == "pass", verdict
        assert plan["baseline"] == [f"e2e/{peer}"]  # judged against the peer still on the custom all-reduce
        figures = verdict["figures"]
        assert figures["canary_itl_p99_seconds"] < THRESHOLD < figures["peers_itl_p99_seconds"], figures
        assert figures["canary_itl_p99_seconds"] < 0.5 * figures["peers_itl_p99_seconds"], figures
        assert f"e2e/{peer}" in done["outcome"] and f"e2e/{canary}" in done["outcome"], done["outcome"]
        for name, status in on_node.items():  # the node's own view agrees with the control plane's
            assert status["state"] == "READY" and status["generation"] > first[name], status
            assert status["engine_args"][-1] == ALL_REDUCE and "--tensor-parallel-size" in status["engine_args"]
        assert load.failures == [], load.failures[:10]
        assert load.unserved == 0, "a moment with no READY replica to send load to"
        assert load.ok[canary] > 0 and load.ok[peer] > 0, load.ok
    finally:
        processes.stop_all()
