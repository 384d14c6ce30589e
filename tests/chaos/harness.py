"""A fleet to break: ``pitstop server`` on PostgreSQL, three nodes (one agent and one simulated engine each),
a real HAProxy in front of the engines, and steady streaming load through it.

Every process runs in its own process group and logs to a file; each can be killed with SIGKILL and started
again with the same configuration, as a supervisor such as systemd would (``Restart=always``). HAProxy
health-checks each replica's readiness on its own agent, so a dead agent takes only its own replica out of
rotation. A response header names the server that answered, so a request lost with a killed engine can be told
from one the fleet should have served.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench.harness.haproxy import config_text, servers_up
from bench.harness.http import probe
from pitstop.local_podman import IMAGE, Podman, engine_volumes
from tests.helpers import free_port, http_ok, wait_until

ROOT = Path(__file__).resolve().parents[2]
PITSTOP = [sys.executable, "-m", "pitstop.cli"]
MODEL = "chaos"
CHECK_INTER_MS = 200
CHECK_FALL = 1
CHECK_RISE = 2
SERVED_BY = "x-served-by"


class Proc:
    """One program in its own process group, logging to ``log``; restartable with the same argv."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
        with self.log.open("ab") as out:
            out.write(f"---- start {self.starts + 1}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the process itself (not what it started in other sessions), and reap it."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class Node:
    """One agent and the one replica it supervises."""

    name: str
    replica: str
    agent_port: int
    engine_port: int
    agent: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.agent_port}"

    @property
    def key(self) -> str:
        return f"{self.name}/{self.replica}"

    def status(self) -> dict[str, Any] | None:
        """The replica as its agent sees it, or None while the agent does not answer."""
        try:
            body: dict[str, Any] = probe.get(f"{self.url}/v1/replicas/{self.replica}", timeout=1.0).json()
            return body
        except (httpx.HTTPError, ValueError):
            return None


def _in_state(node: Node, state: str) -> bool:
    return (node.status() or {}).get("state") == state


def haproxy_config(*, port: int, socket_path: Path, nodes: list[Node]) -> str:
    # Every response names the server that answered it: a request lost with a killed engine is told apart.
    return config_text(port=port, socket_path=socket_path,
                       servers={n.replica: (n.engine_port, n.agent_port) for n in nodes}, timeout_s=60,
                       backend_extra=f"http-response set-header {SERVED_BY} %s", check_inter_ms=CHECK_INTER_MS,
                       check_fall=CHECK_FALL, check_rise=CHECK_RISE)


class HAProxy:
    def __init__(self, tmp: Path, nodes: list[Node]) -> None:
        binary = next((p for p in ("/usr/sbin/haproxy", "/usr/bin/haproxy") if Path(p).exists()), None)
        assert binary is not None, "needs Debian's haproxy"
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket_path = tmp / "haproxy.sock"
        self.names = [n.replica for n in nodes]
        config = tmp / "haproxy.cfg"
        config.write_text(haproxy_config(port=self.port, socket_path=self.socket_path, nodes=nodes))
        self.proc = Proc("haproxy", [binary, "-f", str(config), "-db"], tmp / "haproxy.log")
        self.proc.start()
        wait_until(self.socket_path.exists, 20, what="HAProxy's admin socket")

    def servers_up(self) -> int:
        return servers_up(self.socket_path, self.names, timeout=2)


@dataclass(frozen=True)
class Outcome:
    started: float
    ended: float
    ok: bool
    server: str | None
    error: str | None


class Load:
    """Streaming completions through HAProxy from ``clients`` threads, and HAProxy's UP count every 50 ms."""

    def __init__(self, url: str, haproxy: HAProxy, clients: int = 3, max_tokens: int = 24) -> None:
        self.url = url
        self.haproxy = haproxy
        self.body = {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens, "stream": True}
        self.outcomes: list[Outcome] = []
        self.up: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        self._threads.append(threading.Thread(target=self._sample, daemon=True))

    def _client(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started, ok, server, error = time.monotonic(), False, None, None
                try:
                    with client.stream("POST", f"{self.url}/v1/completions", json=self.body) as response:
                        server = response.headers.get(SERVED_BY)
                        lines = list(response.iter_lines()) if response.status_code == 200 else []
                        ok = "data: [DONE]" in lines
                        error = None if ok else f"HTTP {response.status_code}: {response.read()[:200]!r}"
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                self.outcomes.append(Outcome(started, time.monotonic(), ok, server, error))

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):  # a sample missed while HAProxy is busy is not a server down
                self.up.append((time.monotonic(), self.haproxy.servers_up()))
            self._stop.wait(0.05)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=40)


@dataclass
class Fleet:
    tmp: Path
    database_url: str
    server: Proc = field(init=False)
    cp_port: int = field(default_factory=free_port)
    nodes: list[Node] = field(default_factory=list)
    haproxy: HAProxy | None = None
    # Engines in containers of this Podman (``runtime: container``), else child processes of their agents.
    podman: Podman | None = None

    @property
    def cp(self) -> str:
        return f"http://127.0.0.1:{self.cp_port}"

    def start(self, replicas: int = 3) -> None:
        settings = {"port": self.cp_port, "database_url": self.database_url, "executor_interval_seconds": 0.25,
                    "report_interval_seconds": 0.5, "leader_poll_seconds": 0.5, "policies_enabled": False,
                    "policy_process": False, "action_deadline_seconds": 120,
                    # Twice what HAProxy here takes to put a server back (rise checks, one interval apart, after
                    # the first interval at worst): the default 5 s is for HAProxy's defaults.
                    "rollout_settle_seconds": 2 * (CHECK_RISE + 1) * CHECK_INTER_MS / 1000}
        (self.tmp / "server.yaml").write_text(yaml.safe_dump(settings))
        self.server = Proc("server", [*PITSTOP, "server", "--config", str(self.tmp / "server.yaml"),
                                      "--log-level", "warning"], self.tmp / "logs" / "server.log")
        self.server.start()
        for i in range(replicas):
            self.nodes.append(self._node(i))
        for node in self.nodes:  # an agent whose control plane is not up yet supervises on its own config
            node.agent.start()
        self.wait_control_plane()
        for node in self.nodes:
            wait_until(partial(_in_state, node, "READY"), 60, what=f"{node.key} READY\n{node.agent.tail()}")
        wait_until(lambda: sum(1 for r in self.cp_replicas() if r["ready"]) == replicas, 30,
                   what="the control plane to see every replica READY")
        self.haproxy = HAProxy(self.tmp / "haproxy", self.nodes)
        wait_until(lambda: self.haproxy is not None and self.haproxy.servers_up() == replicas, 20,
                   what="every replica UP in HAProxy")

    def _node(self, i: int) -> Node:
        name, replica = f"node-{i}", f"{MODEL}-{i}"
        agent_port, engine_port = free_port(), free_port()
        gpu_dir = self.tmp / name / "simgpu"
        config: dict[str, Any] = {
            "node": name, "port": agent_port, "control_plane": self.cp, "gpu_backend": "sim", "sim_gpu_count": 1,
            "sim_gpu_dir": str(gpu_dir), "state_dir": str(self.tmp / name / "state"), "report_interval": 0.5,
            "scrape_interval": 0.5, "process_interval": 2.0, "canary_every": 0,
            "backoff": {"base": 0.2, "cap": 1.0},
            "replicas": [{
                "name": replica, "model": MODEL, "port": engine_port, "gpus": [0],
                "args": ["--sim-startup-seconds", "0.5", "--sim-gpu-dir", str(gpu_dir)],
                "shutdown_timeout": 5, "start_timeout": 30, "drain_grace": 0.6, "drain_timeout": 15,
                "stop_timeout": 10, "warmup": {"requests": 2, "settle_count": 0, "max_tokens": 32},
            }],
        }
        if self.podman is not None:
            gpu_dir.mkdir(parents=True, exist_ok=True)
            config.update(docker_host=self.podman.docker_host, container_gpus="none")
            config["replicas"][0].update(runtime="container", image=IMAGE, pull="never",
                                         volumes=[*engine_volumes(), f"{gpu_dir}:{gpu_dir}"])
        path = self.tmp / name / "agent.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        agent = Proc(name, [*PITSTOP, "agent", "--config", str(path)], self.tmp / "logs" / f"{name}.log")
        return Node(name, replica, agent_port, engine_port, agent)

    def wait_control_plane(self) -> None:
        wait_until(lambda: http_ok(f"{self.cp}/readyz") or not self.server.alive(), 60,
                   what=f"the control plane\n{self.server.tail()}")
        assert self.server.alive(), self.server.tail()

    # -- the control plane's API ----------------------------------------------------------------------------
    def get(self, path: str, **params: str) -> Any:
        return probe.get(f"{self.cp}{path}", params=params, timeout=10).raise_for_status().json()

    def cp_replicas(self) -> list[dict[str, Any]]:
        try:
            return list(self.get("/v1/replicas"))
        except httpx.HTTPError:
            return []

    def rolling_restart(self) -> dict[str, Any]:
        answer = probe.post(f"{self.cp}/v1/models/{MODEL}/actions", json={"kind": "rolling_restart"}, timeout=10)
        assert answer.status_code == 201, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def action(self, action_id: int) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = self.get(f"/v1/actions/{action_id}")
            return body
        except httpx.HTTPError:
            return None  # the control plane is down or restarting

    # -- processes --------------------------------------------------------------------------------------------
    def engines(self) -> list[psutil.Process]:
        """Every simulated engine of this fleet still running (its command names this fleet's GPU folders)."""
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                cmd = proc.info["cmdline"] or []
                if (proc.info["status"] != psutil.STATUS_ZOMBIE and "serve" in cmd and "sim" in cmd
                        and any(str(self.tmp) in part for part in cmd)):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def stop(self) -> None:
        """Tear down quickly: nothing is judged after the case, so nothing needs a graceful stop."""
        if self.haproxy is not None:
            self.haproxy.proc.stop(grace=5)
        for node in self.nodes:
            node.agent.stop(grace=0)
        self.server.stop(grace=0)
        for engine in self.engines():  # never leave an engine behind a failed case
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError):
                os.killpg(engine.pid, signal.SIGKILL)
        if self.podman is not None:
            self.podman.cli("rm", "--all", "--force", "--time", "0", check=False)

    def logs(self) -> str:
        parts = [f"== {p.name}\n{p.tail(3000)}" for p in (self.server, *(n.agent for n in self.nodes))]
        return "\n".join(parts)
