"""``pitstop demo``: the whole path on one machine, on the shipped policies, with faults for Pitstop to handle.

Starts the control plane (a fresh SQLite database under the state dir), one agent supervising four simulated
vLLM replicas on simulated GPUs, the Streamlit console, Prometheus and Alertmanager when they are installed, and
a streaming load behind a balancer that follows the agent's readiness (``pitstop.demo_load``). Then, unless
``--calm``, the fault timeline of ``pitstop.demo_faults`` runs: a wedge, a leak, a hot GPU and a latency surge
within five minutes. It prints the URLs and each action as Pitstop takes it, writes the URLs to
``<state-dir>/demo.json``, and at Ctrl-C prints the timeline (also ``<state-dir>/timeline.json``) and stops every
process it started (each in its own process group, so no engine outlives the demo).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import yaml

from controlplane.console.client import ENV_TOKEN as CONSOLE_TOKEN_ENV
from pitstop import demo_faults, demo_prometheus
from pitstop.demo_report import Api, print_plan, report_actions, write_timeline

DEFAULT_PORTS = {"api": 8000, "agent": 9400, "console": 8501, "replica": 8101, "prometheus": 9090,
                 "alertmanager": 9093}


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
        description="Run the control plane, one agent with simulated vLLM replicas, the console, Prometheus (when "
        "installed) and a streaming load on this machine; inject a wedge, a leak, a hot GPU and a latency surge "
        "within five minutes and show what Pitstop does; at Ctrl-C print the timeline.",
    )
    p.add_argument("--state-dir", default=".pitstop", help="where the database, configs and logs go")
    p.add_argument("--replicas", type=int, default=4, help="simulated replicas (one simulated GPU each)")
    p.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct", help="model name the replicas serve")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent streaming requests of the steady load")
    p.add_argument("--calm", action="store_true", help="no faults: a healthy fleet under load")
    p.add_argument("--timeline-scale", type=float, default=1.0,
                   help="run the fault timeline this much faster or slower, with the policy windows the demo "
                   "overlay cuts (printed) scaled alike; for tests")
    p.add_argument("--no-load", action="store_true", help="start no load generator")
    p.add_argument("--no-console", action="store_true", help="start no Streamlit console")
    p.add_argument("--no-prometheus", action="store_true", help="start no Prometheus or Alertmanager")
    p.add_argument("--ready-timeout", type=float, default=120, help="seconds to wait for READY replicas")
    p.add_argument("--duration", type=float, default=0, help="stop by itself after this many seconds (0: Ctrl-C)")
    return p


def fresh_state(state: Path, demo_dir: Path) -> None:
    """Each run starts from a clean fleet: a cooldown or desired state left by an earlier run would change it."""
    for stale in (demo_dir / "db", state / "agent-demo-node-1", state / "simgpu", demo_dir / "prometheus"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale_file in (demo_dir / "fault-clock", demo_dir / "load.json", state / "timeline.json"):
        stale_file.unlink(missing_ok=True)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    state = Path(args.state_dir).resolve()
    demo_dir = state / "demo"
    logs = demo_dir / "logs"
    demo_dir.mkdir(parents=True, exist_ok=True)
    fresh_state(state, demo_dir)
    names = [f"replica-{i}" for i in range(args.replicas)]
    clock_file = demo_dir / "fault-clock"
    try:
        faults = [] if args.calm else demo_faults.fault_plan(names, args.timeline_scale,
                                                             psutil.virtual_memory().total)
    except ValueError as exc:
        print(f"pitstop demo: {exc}; or run it --calm", file=sys.stderr)
        return 2
    overlay = [] if args.calm else demo_faults.overlays(args.timeline_scale)
    settings = demo_faults.write_overlay(demo_dir / "policies", overlay)

    taken: set[int] = set()
    ports = {name: pick_ports(DEFAULT_PORTS[name], 1, taken)[0]
             for name in ("api", "agent", "console", "prometheus", "alertmanager")}
    replica_ports = pick_ports(DEFAULT_PORTS["replica"], args.replicas, taken)
    api_url, agent_url = f"http://127.0.0.1:{ports['api']}", f"http://127.0.0.1:{ports['agent']}"
    console_url = f"http://127.0.0.1:{ports['console']}"
    replica_urls = [f"http://127.0.0.1:{p}" for p in replica_ports]

    agent_token = secrets.token_urlsafe(24)
    operator_token = secrets.token_urlsafe(24)
    server_cfg = demo_dir / "server.yaml"
    agent_cfg = demo_dir / "agent.yaml"
    server = server_config(demo_dir, ports["api"], agent_token, operator_token)
    server |= settings | ({"policy_dir": str(demo_dir / "policies")} if overlay else {})
    server_cfg.write_text(yaml.safe_dump(server, sort_keys=False))
    envs = {n: demo_faults.engine_env(faults, n, clock_file) if faults else {} for n in names}
    agent_cfg.write_text(
        yaml.safe_dump(agent_config(state, ports["agent"], api_url, agent_token, args.model, replica_ports, envs),
                       sort_keys=False)
    )
    os.chmod(server_cfg, 0o600)  # they hold the demo's token
    os.chmod(agent_cfg, 0o600)

    exe = [sys.executable, "-m", "pitstop.cli"]
    # Every process of the demo, engines included, carries this mark in its environment: easy to find.
    mark = {"PITSTOP_DEMO_STATE": str(state)}
    server_child = Child("control plane", [*exe, "server", "--config", str(server_cfg)], logs / "server.log", mark)
    agent = Child("agent", [*exe, "agent", "--config", str(agent_cfg)], logs / "agent.log", mark)
    # The console reads the API with the operator token, handed over by environment (never on a command line).
    console = Child(
        "console",
        [*exe, "console", "--api-url", api_url, "--port", str(ports["console"])],
        logs / "console.log",
        {**mark, CONSOLE_TOKEN_ENV: operator_token},
    )
    surge = next((f for f in faults if f.key == demo_faults.SURGE), None)
    load_stats = demo_dir / "load.json"
    load = Child(
        "load",
        [sys.executable, "-m", "pitstop.demo_load", "--agent", agent_url, "--model", args.model,
         "--stats", str(load_stats), "--concurrency", str(args.concurrency), "--rate", "2",
         "--clock-file", str(clock_file)]
        + (["--surge-after", f"{surge.at:g}", "--surge-concurrency",
            str(demo_faults.SURGE_CLIENTS_PER_REPLICA * args.replicas)] if surge else []),
        logs / "load.log",
        mark,
    )
    started: list[Child] = []
    api = Api(api_url, operator_token)
    clock: float | None = None

    def stop_all() -> None:
        for child in reversed(started):
            child.stop(grace=30 if child is agent else 10)

    # Ctrl-C and a plain `kill` both end in the same orderly stop.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"pitstop demo: state in {state}, logs in {logs}")
        server_child.start()
        started.append(server_child)
        wait_for(lambda: _get_ok(f"{api_url}/healthz"), 60, "the control plane", started)
        agent.start()
        started.append(agent)
        wait_for(lambda: _get_ok(f"{agent_url}/healthz"), 60, "the agent", started)
        monitoring = {} if args.no_prometheus else start_monitoring(demo_dir, ports, api_url, operator_token,
                                                                    started, logs, mark)
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
            **monitoring,
            "agent_token": agent_token,
            "operator_token": operator_token,
            "logs": str(logs),
            "timeline": str(state / "timeline.json"),
        }
        (state / "demo.json").write_text(json.dumps(urls, indent=2) + "\n")
        os.chmod(state / "demo.json", 0o600)
        print_banner(urls, replica_urls, state / "demo.json")
        if faults:
            clock = time.time()
            clock_file.write_text(f"{clock:.3f}\n")  # the engines' and the load's faults count from now
            print_plan(faults, overlay, clock)
        deadline = time.monotonic() + args.duration if args.duration > 0 else None
        seen: dict[int, str] = {}
        while deadline is None or time.monotonic() < deadline:
            for child in (server_child, agent):
                if not child.alive():
                    raise RuntimeError(f"{child.name} exited; see {child.log}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                report_actions(api, seen, clock or time.time())
            time.sleep(2)
        return 0
    except KeyboardInterrupt:
        print("\npitstop demo: stopping …")
        return 0
    except RuntimeError as exc:
        print(f"pitstop demo: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the timeline or the stop
        if load in started:
            load.stop(grace=10)
        if server_child.alive():
            write_timeline(api, faults, clock, load_stats, state / "timeline.json")
        stop_all()
        print("pitstop demo: every process stopped")


def start_monitoring(demo_dir: Path, ports: Mapping[str, int], api_url: str, token: str, started: list[Child],
                     logs: Path, mark: dict[str, str]) -> dict[str, str]:
    """Prometheus and Alertmanager when installed (their URLs), else a line on how to get them."""
    binaries = demo_prometheus.find_binaries()
    if binaries is None:
        print(f"pitstop demo: {demo_prometheus.HOW_TO_GET}")
        return {}
    commands = demo_prometheus.argv(binaries, demo_dir / "prometheus", ports["prometheus"], ports["alertmanager"],
                                    api_url, token)
    urls: dict[str, str] = {}
    for name, command in commands.items():
        child = Child(name, command, logs / f"{name}.log", mark)
        child.start()
        started.append(child)
        url = f"http://127.0.0.1:{ports[name]}"
        try:
            wait_for(lambda u=url: _get_ok(f"{u}/-/ready"), 60, name, [child])  # type: ignore[misc]
        except RuntimeError as exc:
            print(f"pitstop demo: {exc}; going on without it")
            continue
        urls[name] = url
    return urls


def print_banner(urls: Mapping[str, object], replica_urls: list[str], manifest: Path) -> None:
    print()
    print("Pitstop demo is up:")
    if urls["console"]:
        print(f"  console          {urls['console']}")
    print(f"  control plane    {urls['api']}   (API docs: {urls['api_docs']})")
    print(f"  agent /metrics   {urls['agent_metrics']}")
    for url in replica_urls:
        print(f"  replica          {url}   (vLLM API, /metrics)")
    if urls.get("prometheus"):
        print(f"  Prometheus       {urls['prometheus']}   (targets: {urls['prometheus']}/targets)")
    if urls.get("alertmanager"):
        print(f"  Alertmanager     {urls['alertmanager']}")
    print(f"  URLs and the demo's tokens (agent, operator) are in {manifest}. Ctrl-C stops everything.")
    print(flush=True)


def server_config(demo_dir: Path, port: int, agent_token: str, operator_token: str) -> dict[str, object]:
    return {
        "host": "127.0.0.1",
        "port": port,
        "database_url": f"sqlite:///{demo_dir / 'db' / 'pitstop.db'}",
        "agent_tokens": [agent_token],
        "operator_tokens": [operator_token],
        "policy_interval_seconds": 2.0,
    }


def agent_config(
    state: Path, port: int, api_url: str, token: str, model: str, replica_ports: list[int],
    envs: Mapping[str, dict[str, str]],
) -> dict[str, object]:
    return {
        "node": "demo-node-1",
        "host": "127.0.0.1",
        "port": port,
        "control_plane": api_url,
        "token": token,
        "report_interval": 2.0,
        "scrape_interval": 2.0,
        "process_interval": 2.0,
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
                # The demo's balancer polls readiness every half second: two seconds is plenty to notice.
                "drain_grace": 2.0,
                "env": dict(envs.get(f"replica-{i}", {})),
            }
            for i, p in enumerate(replica_ports)
        ],
    }
