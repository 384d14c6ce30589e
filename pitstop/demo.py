"""``pitstop demo``: the whole path on one machine, on the embedded defaults.

Starts the control plane (SQLite under the state dir), one agent supervising simulated vLLM replicas on
simulated GPUs, the Streamlit console and a small streaming load, prints the URLs, writes them to
``<state-dir>/demo.json`` and runs until Ctrl-C, then stops every process it started (each in its own process
group, so no engine outlives the demo).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from controlplane.console.client import ENV_TOKEN as CONSOLE_TOKEN_ENV

DEFAULT_PORTS = {"api": 8000, "agent": 9400, "console": 8501, "replica": 8101}


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,  # its own process group: we stop it and everything it spawned
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        # Children (engines) may outlive a leader that exited: the group gets SIGKILL regardless.
        _signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            print(f"pitstop demo: {self.name} (pid {self.proc.pid}) did not exit", file=sys.stderr)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(preferred: int, count: int, taken: set[int]) -> list[int]:
    """``count`` consecutive-ish free loopback ports starting at ``preferred``, skipping busy ones."""
    ports: list[int] = []
    candidate = preferred
    while len(ports) < count and candidate < 65535:
        if candidate not in taken and port_free(candidate):
            ports.append(candidate)
            taken.add(candidate)
        candidate += 1
    if len(ports) < count:
        raise RuntimeError(f"no free port at or above {preferred}")
    return ports


def wait_for(check: Callable[[], bool], timeout: float, what: str, children: Sequence[Child]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited while waiting for {what}; see {child.log}")
        if check():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def _get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _replicas_ready(url: str, count: int, token: str | None = None) -> bool:
    """At least ``count`` READY replicas in the list at ``url`` (the agent's, or the control plane's)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        replicas = httpx.get(url, headers=headers, timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(replicas, list) and sum(1 for r in replicas if r.get("ready")) >= count


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pitstop demo",
        description="Run the control plane, one agent with simulated vLLM replicas, the console and a small "
        "streaming load on this machine until Ctrl-C.",
    )
    p.add_argument("--state-dir", default=".pitstop", help="where the database, configs and logs go")
    p.add_argument("--replicas", type=int, default=3, help="simulated replicas (one simulated GPU each)")
    p.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct", help="model name the replicas serve")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent streaming requests of the load")
    p.add_argument("--no-load", action="store_true", help="start no load generator")
    p.add_argument("--no-console", action="store_true", help="start no Streamlit console")
    p.add_argument("--ready-timeout", type=float, default=100, help="seconds to wait for READY replicas")
    p.add_argument("--duration", type=float, default=0, help="stop by itself after this many seconds (0: Ctrl-C)")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    state = Path(args.state_dir).resolve()
    demo_dir = state / "demo"
    logs = demo_dir / "logs"
    demo_dir.mkdir(parents=True, exist_ok=True)

    taken: set[int] = set()
    api_port = pick_ports(DEFAULT_PORTS["api"], 1, taken)[0]
    agent_port = pick_ports(DEFAULT_PORTS["agent"], 1, taken)[0]
    console_port = pick_ports(DEFAULT_PORTS["console"], 1, taken)[0]
    replica_ports = pick_ports(DEFAULT_PORTS["replica"], args.replicas, taken)
    api_url = f"http://127.0.0.1:{api_port}"
    agent_url = f"http://127.0.0.1:{agent_port}"
    console_url = f"http://127.0.0.1:{console_port}"
    replica_urls = [f"http://127.0.0.1:{p}" for p in replica_ports]

    agent_token = secrets.token_urlsafe(24)
    operator_token = secrets.token_urlsafe(24)
    server_cfg = demo_dir / "server.yaml"
    agent_cfg = demo_dir / "agent.yaml"
    server_cfg.write_text(yaml.safe_dump(server_config(state, api_port, agent_token, operator_token), sort_keys=False))
    agent_cfg.write_text(
        yaml.safe_dump(agent_config(state, agent_port, api_url, agent_token, args.model, replica_ports),
                       sort_keys=False)
    )
    os.chmod(server_cfg, 0o600)  # they hold the demo's token
    os.chmod(agent_cfg, 0o600)

    exe = [sys.executable, "-m", "pitstop.cli"]
    # Every process of the demo, engines included, carries this mark in its environment: easy to find.
    mark = {"PITSTOP_DEMO_STATE": str(state)}
    server = Child("control plane", [*exe, "server", "--config", str(server_cfg)], logs / "server.log", mark)
    agent = Child("agent", [*exe, "agent", "--config", str(agent_cfg)], logs / "agent.log", mark)
    # The console reads the API with the operator token, handed over by environment (never on a command line).
    console = Child(
        "console",
        [*exe, "console", "--api-url", api_url, "--port", str(console_port)],
        logs / "console.log",
        {**mark, CONSOLE_TOKEN_ENV: operator_token},
    )
    load = Child(
        "load",
        [*exe, "sim", "load", *replica_urls, "--model", args.model, "--concurrency", str(args.concurrency),
         "--duration", "0", "--rate", "2"],
        logs / "load.log",
        mark,
    )
    started: list[Child] = []

    def stop_all() -> None:
        for child in reversed(started):
            child.stop(grace=30 if child is agent else 10)

    # Ctrl-C and a plain `kill` both end in the same orderly stop.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"pitstop demo: state in {state}, logs in {logs}")
        server.start()
        started.append(server)
        wait_for(lambda: _get_ok(f"{api_url}/healthz"), 60, "the control plane", started)
        agent.start()
        started.append(agent)
        wait_for(lambda: _get_ok(f"{agent_url}/healthz"), 60, "the agent", started)
        if not args.no_console:
            console.start()
            started.append(console)
        print(f"pitstop demo: waiting for {args.replicas} replicas to start and warm up …")
        wait_for(lambda: _replicas_ready(f"{agent_url}/v1/replicas", args.replicas), args.ready_timeout,
                 "READY replicas", started)
        # The console shows what the control plane knows: wait for the agent's next report too.
        wait_for(lambda: _replicas_ready(f"{api_url}/v1/replicas", args.replicas, operator_token), 30,
                 "the control plane to see the READY replicas", started)
        if not args.no_console:
            wait_for(lambda: _get_ok(f"{console_url}/_stcore/health"), 60, "the console", started)
        if not args.no_load:
            load.start()
            started.append(load)
        urls = {
            "console": console_url if not args.no_console else None,
            "api": api_url,
            "api_docs": f"{api_url}/docs",
            "agent": agent_url,
            "agent_metrics": f"{agent_url}/metrics",
            "replicas": replica_urls,
            "agent_token": agent_token,
            "operator_token": operator_token,
            "logs": str(logs),
        }
        (state / "demo.json").write_text(json.dumps(urls, indent=2) + "\n")
        os.chmod(state / "demo.json", 0o600)
        print_banner(urls, replica_urls, state / "demo.json")
        deadline = time.monotonic() + args.duration if args.duration > 0 else None
        while deadline is None or time.monotonic() < deadline:
            for child in (server, agent):
                if not child.alive():
                    raise RuntimeError(f"{child.name} exited; see {child.log}")
            time.sleep(1)
        return 0
    except KeyboardInterrupt:
        print("\npitstop demo: stopping …")
        return 0
    except RuntimeError as exc:
        print(f"pitstop demo: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        print("pitstop demo: every process stopped")


def print_banner(urls: Mapping[str, object], replica_urls: list[str], manifest: Path) -> None:
    print()
    print("Pitstop demo is up:")
    if urls["console"]:
        print(f"  console          {urls['console']}")
    print(f"  control plane    {urls['api']}   (API docs: {urls['api_docs']})")
    print(f"  agent /metrics   {urls['agent_metrics']}")
    for url in replica_urls:
        print(f"  replica          {url}   (vLLM API, /metrics)")
    print(f"  URLs and the demo's tokens (agent, operator) are in {manifest}. Ctrl-C stops everything.")
    print(flush=True)


def server_config(state: Path, port: int, agent_token: str, operator_token: str) -> dict[str, object]:
    return {
        "host": "127.0.0.1",
        "port": port,
        "database_url": f"sqlite:///{state / 'pitstop.db'}",
        "agent_tokens": [agent_token],
        "operator_tokens": [operator_token],
    }


def agent_config(
    state: Path, port: int, api_url: str, token: str, model: str, replica_ports: list[int]
) -> dict[str, object]:
    return {
        "node": "demo-node-1",
        "host": "127.0.0.1",
        "port": port,
        "control_plane": api_url,
        "token": token,
        "report_interval": 2.0,
        "gpu_backend": "sim",
        "sim_gpu_count": len(replica_ports),
        "sim_gpu_dir": str(state / "simgpu"),
        "state_dir": str(state / "agent-demo-node-1"),
        "replicas": [
            {
                "name": f"replica-{i}",
                "model": model,
                "engine": "sim",
                "port": p,
                "gpus": [i],
                "args": ["--max-num-seqs", "64", "--sim-gpu-dir", str(state / "simgpu")],
            }
            for i, p in enumerate(replica_ports)
        ],
    }
