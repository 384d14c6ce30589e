"""``pitstop demo``: the whole path on one machine, on the shipped policies, with faults for Pitstop to handle.

Starts the control plane (a fresh SQLite database under the state dir), one agent supervising four simulated
vLLM replicas on simulated GPUs, the Streamlit console, Prometheus and Alertmanager when they are installed, and
a streaming load behind a balancer that follows the agent's readiness (``pitstop.demo_load``). Then, unless
``--calm``, the fault timeline of ``pitstop.demo_faults`` runs: a wedge, a leak, a hot GPU and a latency surge
within five minutes. It prints the URLs and each action as Pitstop takes it, and writes the URLs to
``<state-dir>/demo.json``.

It ends on Ctrl-C, SIGTERM, SIGHUP (its terminal closed) or when its standard output goes away (the reader of
its pipe exited): it prints the timeline (also ``<state-dir>/timeline.json``) and stops every process it
started, all at once and within 15 s (``pitstop.demo_procs``). One demo runs per state dir
(``pitstop.demo_lock``); the fleet of one killed with SIGKILL is found by its mark and stopped by the next.
Every URL it prints is checked to be served by a process it started (``pitstop.demo_ports``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import psutil
import yaml

from controlplane.console.client import ENV_TOKEN as CONSOLE_TOKEN_ENV
from pitstop import demo_faults, demo_lock, demo_prometheus, local_podman
from pitstop.demo_config import Containers, agent_config, server_config
from pitstop.demo_output import Output
from pitstop.demo_ports import check_owner, pick_ports
from pitstop.demo_procs import MARK, Child, Stop, stop_leftovers
from pitstop.demo_report import HTTP, Api, print_banner, print_plan, report_actions, write_timeline

# Child: the suites' and benchmarks' fixtures start their processes with it.
__all__ = ["Child", "build_parser", "main", "pick_ports"]

DEFAULT_PORTS = {"api": 8000, "agent": 9400, "console": 8501, "replica": 8101, "prometheus": 9090,
                 "alertmanager": 9093}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The stop must be over within 15 s of the signal. Everything is SIGTERMed at once; the load gets LOAD_WAIT to
# write its last figures, each of the timeline's two reads TIMELINE_TIMEOUT; at STOP_GRACE whatever is left is
# SIGKILLed (Stop.finish then waits up to 3 s more). The agent's own stop of its engines fits inside STOP_GRACE:
# see the replicas' drain and stop timeouts in agent_config.
STOP_GRACE = 10.0
LOAD_WAIT = 2.0
TIMELINE_TIMEOUT = 3.0


class Interrupted(KeyboardInterrupt):
    """Why the demo stops early: a signal's name, or its output gone."""


class Signals:
    """Ctrl-C, SIGTERM and SIGHUP (a closed terminal) raise ``Interrupted`` in the main thread, once.

    Only the first raises: a second Ctrl-C, or SIGHUP after the stop began, must not cut the timeline or the
    stop short. The stop sets ``fired`` first thing, whatever ended the run (a failure, the duration).
    """

    def __init__(self) -> None:
        self.fired = False

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.handle)

    def handle(self, signum: int, frame: object) -> None:
        self.fire(signal.Signals(signum).name)

    def fire(self, why: str) -> None:
        if not self.fired:
            self.fired = True
            raise Interrupted(why)


DOCKER_SOCKET = "unix:///var/run/docker.sock"


def _get_ok(url: str) -> bool:
    try:
        return HTTP.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _replicas_ready(url: str, count: int, token: str | None = None) -> bool:
    """At least ``count`` READY replicas in the list at ``url`` (the agent's, or the control plane's)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        replicas = HTTP.get(url, headers=headers, timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(replicas, list) and sum(1 for r in replicas if r.get("ready")) >= count


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pitstop demo",
        description="Run the control plane, one agent with simulated vLLM replicas, the console, Prometheus (when "
        "installed) and a streaming load on this machine; inject a wedge, a leak, a hot GPU and a latency surge "
        "within five minutes and show what Pitstop does; at Ctrl-C print the timeline and stop everything.",
    )
    p.add_argument("--state-dir", default=".pitstop", help="where the database, configs and logs go")
    p.add_argument("--replace", action="store_true",
                   help="stop the demo already running with this state dir, then start (without: exit 2)")
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
    p.add_argument("--containers", action="store_true",
                   help="run the engines in containers: a Podman of the demo's own where podman and runc are "
                   "installed, else the Docker daemon on /var/run/docker.sock (the image is built here, never "
                   "pulled)")
    return p


def fresh_state(state: Path, demo_dir: Path) -> None:
    """Each run starts from a clean fleet: a cooldown or desired state left by an earlier run would change it."""
    for stale in (demo_dir / "db", state / "agent-demo-node-1", state / "simgpu", demo_dir / "prometheus"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale_file in (demo_dir / "fault-clock", demo_dir / "load.json", state / "timeline.json",
                       state / "demo.json"):
        stale_file.unlink(missing_ok=True)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    state = Path(args.state_dir).resolve()
    # The guard stays for the rest of the process: the interpreter's last flush at exit goes through it too.
    output = Output(state / "demo" / "logs" / "demo.log")
    output.install()
    signals = Signals()  # Ctrl-C, a plain `kill` and a closed terminal all end in the same orderly stop
    signals.install()
    try:
        lock = demo_lock.acquire(state)
        if lock is None and not args.replace:
            print(demo_lock.describe(state, demo_lock.holder(state)), file=sys.stderr)
            return 2
        if lock is None:
            print(f"pitstop demo: stopping the demo running with this state dir (pid {demo_lock.holder(state)}) …",
                  flush=True)
            lock = demo_lock.take_over(state)
            if lock is None:
                print("pitstop demo: could not stop it (another user's?)", file=sys.stderr)
                return 2
            print("pitstop demo: it stopped", flush=True)
    except Interrupted:
        return 0
    try:
        left = stop_leftovers(str(state))
        if left:
            print(f"pitstop demo: stopped {len(left)} processes an earlier demo left running "
                  f"(pids {', '.join(str(p.pid) for p in left)})", flush=True)
        return Demo(args, state, output, signals).run()
    except Interrupted:
        return 0
    except RuntimeError as exc:  # no free port, say
        print(f"pitstop demo: {exc}", file=sys.stderr)
        return 1
    finally:
        lock.release()


class Demo:
    """One run: the configs written, the fleet started and watched, and all of it stopped at the end."""

    def __init__(self, args: argparse.Namespace, state: Path, output: Output, signals: Signals) -> None:
        self.args = args
        self.state = state
        self.output = output
        self.signals = signals
        self.demo_dir = state / "demo"
        self.logs = self.demo_dir / "logs"
        self.started: list[Child] = []
        self.faults: list[demo_faults.Fault] = []
        self.clock: float | None = None
        self.api_ours = False  # the control plane's port checked to be its own: only then is the timeline read
        self.podman: local_podman.Podman | None = None  # --containers: the demo's own Podman service

    def run(self) -> int:
        args, state, demo_dir = self.args, self.state, self.demo_dir
        demo_dir.mkdir(parents=True, exist_ok=True)
        fresh_state(state, demo_dir)
        names = [f"replica-{i}" for i in range(args.replicas)]
        clock_file = demo_dir / "fault-clock"
        try:
            self.faults = [] if args.calm else demo_faults.fault_plan(names, args.timeline_scale,
                                                                      psutil.virtual_memory().total)
        except ValueError as exc:
            print(f"pitstop demo: {exc}; or run it --calm", file=sys.stderr)
            return 2
        faults = self.faults
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
        containers = self.containers({MARK: str(state)}) if args.containers else None
        agent_cfg.write_text(yaml.safe_dump(
            agent_config(state, ports["agent"], api_url, agent_token, args.model, replica_ports, envs, containers),
            sort_keys=False))
        os.chmod(server_cfg, 0o600)  # they hold the demo's token
        os.chmod(agent_cfg, 0o600)

        exe = [sys.executable, "-m", "pitstop.cli"]
        logs = self.logs
        # Every process of the demo, engines included, carries this mark in its environment: easy to find.
        mark = {MARK: str(state)}
        self.server = Child("control plane", [*exe, "server", "--config", str(server_cfg)], logs / "server.log",
                            mark)
        agent = Child("agent", [*exe, "agent", "--config", str(agent_cfg)], logs / "agent.log", mark)
        # The console reads the API with the operator token, handed over by environment (never on a command line).
        console = Child("console", [*exe, "console", "--api-url", api_url, "--port", str(ports["console"])],
                        logs / "console.log", {**mark, CONSOLE_TOKEN_ENV: operator_token})
        surge = next((f for f in faults if f.key == demo_faults.SURGE), None)
        self.load_stats = demo_dir / "load.json"
        self.load = Child(
            "load",
            [sys.executable, "-m", "pitstop.demo_load", "--agent", agent_url, "--model", args.model,
             "--stats", str(self.load_stats), "--concurrency", str(args.concurrency), "--rate", "2",
             "--clock-file", str(clock_file)]
            + (["--surge-after", f"{surge.at:g}", "--surge-concurrency",
                str(demo_faults.SURGE_CLIENTS_PER_REPLICA * args.replicas)] if surge else []),
            logs / "load.log",
            mark,
        )
        self.api = Api(api_url, operator_token, timeout=3)  # short: a lost stdout is checked between reads
        try:
            print(f"pitstop demo: state in {state}, logs in {logs}")
            self.up(self.server, ports["api"], lambda: _get_ok(f"{api_url}/healthz"), 60)
            self.api_ours = True
            self.up(agent, ports["agent"], lambda: _get_ok(f"{agent_url}/healthz"), 60)
            monitoring = {} if args.no_prometheus else self.start_monitoring(ports, api_url, operator_token, mark)
            if not args.no_console:
                console.start()
                self.started.append(console)
            print(f"pitstop demo: waiting for {args.replicas} replicas to start and warm up …")
            self.wait_for(lambda: _replicas_ready(f"{agent_url}/v1/replicas", args.replicas), args.ready_timeout,
                          "READY replicas")
            for name, port in zip(names, replica_ports, strict=True):
                if containers is None:  # the engines are the agent's children (in containers, the daemon's)
                    check_owner(f"agent's {name}", port, self.pid(agent))
            # The console shows what the control plane knows: wait for the agent's next report too.
            self.wait_for(lambda: _replicas_ready(f"{api_url}/v1/replicas", args.replicas, operator_token), 30,
                          "the control plane to see the READY replicas")
            if not args.no_console:
                self.up(console, ports["console"], lambda: _get_ok(f"{console_url}/_stcore/health"), 60,
                        start=False)
            if not args.no_load:
                self.load.start()
                self.started.append(self.load)
            urls = {
                "pid": os.getpid(),
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
                self.clock = time.time()
                clock_file.write_text(f"{self.clock:.3f}\n")  # the engines' and the load's faults count from now
                print_plan(faults, overlay, self.clock)
            self.watch(agent)
            return 0
        except Interrupted as why:
            print(f"\npitstop demo: {why}: stopping …", flush=True)
            return 0
        except RuntimeError as exc:
            print(f"pitstop demo: {exc}", file=sys.stderr)
            return 1
        finally:
            try:
                self.stop()
            except Interrupted:  # the first signal came just as the stop began, before it could say so
                self.stop()

    def containers(self, mark: dict[str, str]) -> Containers:
        """Where the engines' containers run: a Podman of the demo's own (its storage in the state dir), else the
        Docker daemon on its usual socket. Every engine carries the demo's mark, as the agent's children do."""
        shared = {f"{self.state}:{self.state}", f"{self.demo_dir}:{self.demo_dir}:ro"}  # GPU files, fault clock
        (self.state / "simgpu").mkdir(parents=True, exist_ok=True)
        if local_podman.available():
            print("pitstop demo: starting a Podman of the demo's own for the engines' containers …", flush=True)
            self.podman = local_podman.Podman(self.demo_dir / "podman", env=mark).start()
            docker_host = self.podman.docker_host
        elif local_podman.answers(DOCKER_SOCKET):
            docker_host = DOCKER_SOCKET
            local_podman.ensure_engine_image(docker_host)
        else:
            raise RuntimeError("--containers needs Podman (Debian: apt-get install podman runc) or a Docker daemon "
                               f"answering on {DOCKER_SOCKET}")
        return Containers(docker_host, local_podman.IMAGE, [*local_podman.engine_volumes(), *sorted(shared)], mark)

    def watch(self, agent: Child) -> None:
        """Print each action as it happens until the duration is over, a signal comes or the output is gone."""
        deadline = time.monotonic() + self.args.duration if self.args.duration > 0 else None
        seen: dict[int, str] = {}
        next_report = 0.0
        while deadline is None or time.monotonic() < deadline:
            self.check(self.server, agent)
            if time.monotonic() >= next_report:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    report_actions(self.api, seen, self.clock or time.time())
                next_report = time.monotonic() + 2
            time.sleep(0.5)

    def check(self, *children: Child) -> None:
        """Raise if one of ``children`` exited, or stop (``Interrupted``) if the output is gone."""
        if self.output.lost():
            self.signals.fire("its standard output is gone")
        for child in children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited; see {child.log}")

    def wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check(*self.started)
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")

    def up(self, child: Child, port: int, ready: Callable[[], bool], timeout: float, start: bool = True) -> None:
        """Start ``child``, wait until it answers, and check that it is ``child`` that listens on ``port``."""
        if start:
            child.start()
            self.started.append(child)
        self.wait_for(ready, timeout, f"the {child.name}")
        check_owner(child.name, port, self.pid(child))

    @staticmethod
    def pid(child: Child) -> int:
        assert child.proc is not None, f"{child.name} was never started"
        return child.proc.pid

    def stop(self) -> None:
        """Stop everything at once within STOP_GRACE (+3 s for SIGKILL), the timeline read on the way."""
        self.signals.fired = True  # from now on no signal interrupts: the stop is what they ask for
        self.output.lost()  # a reader gone quietly: what follows goes to the log, not into a broken pipe
        stop = Stop(time.monotonic() + STOP_GRACE, mark=str(self.state))
        # All but the control plane now: the agent drains and stops its engines while the timeline is read.
        stop.terminate(c for c in self.started if c is not self.server)
        api = None
        if self.api_ours and self.server.alive():
            stop.wait([self.load], time.monotonic() + LOAD_WAIT)  # its last figures go into the timeline
            api = Api(self.api.url, self.api.token, timeout=TIMELINE_TIMEOUT)
        write_timeline(api, self.faults, self.clock, self.load_stats, self.state / "timeline.json")
        stop.terminate(self.started)
        left = stop.finish()
        if self.podman is not None:  # the agent stopped its containers; anything left goes with the service
            self.podman.close()
        (self.state / "demo.json").unlink(missing_ok=True)  # its URLs are nobody's now
        if left:
            print(f"pitstop demo: could not stop pids {', '.join(str(p.pid) for p in left)}", file=sys.stderr)
        else:
            print("pitstop demo: every process stopped", flush=True)

    def start_monitoring(self, ports: Mapping[str, int], api_url: str, token: str,
                         mark: dict[str, str]) -> dict[str, str]:
        """Prometheus and Alertmanager when installed (their URLs), else a line on how to get them."""
        binaries = demo_prometheus.find_binaries()
        if binaries is None:
            print(f"pitstop demo: {demo_prometheus.HOW_TO_GET}")
            return {}
        commands = demo_prometheus.argv(binaries, self.demo_dir / "prometheus", ports["prometheus"],
                                        ports["alertmanager"], api_url, token)
        urls: dict[str, str] = {}
        for name, command in commands.items():
            child = Child(name, command, self.logs / f"{name}.log", mark)
            child.start()
            self.started.append(child)
            url = f"http://127.0.0.1:{ports[name]}"
            try:
                self.wait_for(lambda u=url: _get_ok(f"{u}/-/ready"), 60, name)  # type: ignore[misc]
            except RuntimeError as exc:
                print(f"pitstop demo: {exc}; going on without it")
                self.started.remove(child)  # watched no more: the fleet runs on without it
                child.stop(grace=5)
                continue
            check_owner(name, ports[name], self.pid(child))
            urls[name] = url
        return urls
