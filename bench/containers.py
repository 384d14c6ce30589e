"""Engines in containers against engines as processes: one agent, N simulated replicas, each runtime in turn.

Each run starts a control-plane stand-in (``bench/agent_cost.py``'s: a loopback server in this process that
answers every report with the desired state the benchmark sets), then ``pitstop agent`` with ``--replicas``
simulated vLLM engines (``pitstop sim serve``) at the agent's default intervals, first as child processes
(``runtime: process``), then in Podman containers (``runtime: container``, through Podman's Docker API on a
socket of the benchmark's own, the image built locally as the tests build it: ``pitstop/local_podman.py``). For
each runtime it measures:

- start to READY: from the agent's launch to each replica's READY (warmup included), the median over replicas;
- restart: ``--restarts`` replicas, one after another, each asked for a new generation through the desired
  state; from the first look that finds it out of READY to READY at the new generation (drain, stop, start,
  warmup; ``drain_grace`` is cut to 0.5 s so the load balancer's grace does not dominate);
- the agent's CPU (user + system, its engines excluded) and RSS over ``--duration`` seconds once every replica
  has been READY for ``--settle`` seconds; with containers, the Podman service's CPU over the same window.

    python bench/containers.py                  # 8 replicas, 3 runs of each runtime, 60 s windows
    python bench/containers.py --runs 1 --duration 20 --restarts 1
    python bench/containers.py --quick          # 2 replicas, 1 run, 5 s windows: the benchmark works

Target (issue 32): the agent's CPU and memory with containers within 1.2x of the process runtime's. Needs podman
and runc (Debian's packages; ``make deps`` installs them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.agent_cost import StandIn  # noqa: E402
from bench.harness.figures import shown_path, write_json  # noqa: E402
from bench.harness.ports import free_port  # noqa: E402
from pitstop.local_podman import IMAGE, Podman, available, engine_volumes  # noqa: E402

NODE = "bench-node"
SIM_ARGS = ["--sim-startup-seconds", "0.5"]


def _replicas(url: str) -> dict[str, dict[str, Any]]:
    try:
        return {r["name"]: r for r in httpx.get(f"{url}/v1/replicas", timeout=5).json()}
    except (httpx.HTTPError, ValueError):
        return {}


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def run_once(runtime: str, replicas: int, duration: float, settle: float, restarts: int, tmp: Path,
             podman: Podman | None) -> dict[str, Any]:
    stand_in = StandIn(NODE).__enter__()
    port = free_port()
    gpu_dir = tmp / "simgpu"
    gpu_dir.mkdir(parents=True, exist_ok=True)
    specs = []
    for i in range(replicas):
        spec: dict[str, Any] = {"name": f"r{i}", "model": "tiny", "port": free_port(), "gpus": [i % 8],
                                "args": SIM_ARGS, "drain_grace": 0.5, "stop_timeout": 10, "shutdown_timeout": 2}
        if runtime == "container":
            assert podman is not None
            spec.update(runtime="container", image=IMAGE, pull="never",
                        volumes=[*engine_volumes(), f"{gpu_dir}:{gpu_dir}"])
        specs.append(spec)
    config: dict[str, Any] = {"node": NODE, "port": port, "control_plane": f"http://127.0.0.1:{stand_in.port}",
                              "gpu_backend": "sim", "sim_gpu_count": 8, "sim_gpu_dir": str(gpu_dir),
                              "state_dir": str(tmp / "state"), "replicas": specs}
    if podman is not None:
        config.update(docker_host=podman.docker_host, container_gpus="none")
    (tmp / "agent.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
    url = f"http://127.0.0.1:{port}"
    log = (tmp / "agent.log").open("wb")
    launched = time.monotonic()
    agent = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "agent", "--config", str(tmp / "agent.yaml")],
                             cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    ready_at: dict[str, float] = {}
    try:
        deadline = launched + 180
        while len(ready_at) < replicas:
            if time.monotonic() > deadline or agent.poll() is not None:
                raise RuntimeError(f"{runtime}: not every replica READY: {sorted(ready_at)}; see {tmp / 'agent.log'}")
            for name, replica in _replicas(url).items():
                if replica["state"] == "READY" and name not in ready_at:
                    ready_at[name] = time.monotonic() - launched
            time.sleep(0.05)
        time.sleep(settle)
        proc = psutil.Process(agent.pid)
        service = psutil.Process(podman.service.pid) if podman is not None and podman.service else None
        cpu0, wall0 = _cpu(proc), time.monotonic()
        service0 = _cpu(service) if service is not None else 0.0
        rss: list[int] = []
        while time.monotonic() - wall0 < duration:
            rss.append(proc.memory_info().rss)
            time.sleep(1.0)
        elapsed = time.monotonic() - wall0
        cpu = 100.0 * (_cpu(proc) - cpu0) / elapsed
        service_cpu = 100.0 * (_cpu(service) - service0) / elapsed if service is not None else None
        restart_seconds = []
        for i in range(restarts):
            name = f"r{i}"
            stand_in.answer = json.dumps({"protocol_version": 1, "node": NODE, "replicas": [
                {"name": f"r{j}", "generation": 1 if j <= i else 0, "engine_args": SIM_ARGS}
                for j in range(replicas)]}).encode()
            left = None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                replica = _replicas(url).get(name, {})
                if left is None and replica.get("state") not in (None, "READY"):
                    left = time.monotonic()
                if left is not None and replica.get("state") == "READY" and replica.get("generation") == 1:
                    restart_seconds.append(time.monotonic() - left)
                    break
                time.sleep(0.02)
            else:
                raise RuntimeError(f"{runtime}: {name} did not restart; see {tmp / 'agent.log'}")
        return {"runtime": runtime, "start_to_ready_s": statistics.median(ready_at.values()),
                "all_ready_s": max(ready_at.values()), "restart_s": statistics.median(restart_seconds),
                "restarts_s": restart_seconds, "agent_cpu_percent": cpu, "agent_rss_mb": statistics.median(rss) / 2**20,
                "daemon_cpu_percent": service_cpu}
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=120)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        log.close()
        stand_in.__exit__()
        if podman is not None:
            podman.cli("rm", "--all", "--force", "--time", "0", check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of CPU and RSS measurement")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after every replica is READY")
    parser.add_argument("--restarts", type=int, default=3, help="replicas restarted one after another")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "containers.json",
                        help="the JSON document: settings, every run, medians and ratios")
    parser.add_argument("--quick", action="store_true", help="2 replicas, 1 run, 5 s windows, 1 restart")
    args = parser.parse_args(argv)
    if args.quick:
        args.replicas, args.runs, args.duration, args.settle, args.restarts = 2, 1, 5.0, 1.0, 1
    if not available():
        print("podman and runc are needed (Debian: apt-get install podman runc; make deps)", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-containers-") as base:
        podman = Podman(Path(base) / "podman").start()
        try:
            for n in range(args.runs):
                for runtime in ("process", "container"):  # side by side, alternating, on the same machine
                    tmp = Path(base) / f"{runtime}-{n}"
                    result = run_once(runtime, args.replicas, args.duration, args.settle, args.restarts, tmp,
                                      podman if runtime == "container" else None)
                    runs.append(result)
                    print(json.dumps(result), flush=True)
        finally:
            podman.close()
    medians = {}
    for runtime in ("process", "container"):
        mine = [r for r in runs if r["runtime"] == runtime]
        medians[runtime] = {k: statistics.median(r[k] for r in mine)
                            for k in ("start_to_ready_s", "all_ready_s", "restart_s", "agent_cpu_percent",
                                      "agent_rss_mb")}
    # A short window can read 0.0 s of agent CPU: the kernel counts it in clock ticks (10 ms). No ratio then.
    ratio = {k: medians["container"][k] / medians["process"][k] if medians["process"][k] > 0 else None
             for k in medians["process"]}
    print(f"{'figure':<22}{'process':>10}{'container':>11}{'ratio':>8}")
    for key, r in ratio.items():
        shown = f"{r:>8.2f}" if r is not None else f"{'n/a':>8}"
        print(f"{key:<22}{medians['process'][key]:>10.2f}{medians['container'][key]:>11.2f}{shown}")
    daemon = [r["daemon_cpu_percent"] for r in runs if r["daemon_cpu_percent"] is not None]
    if daemon:
        print(f"podman service CPU while measured: {statistics.median(daemon):.2f} % (median)")
    write_json(args.out, "containers", {
        "settings": {"replicas": args.replicas, "runs": args.runs, "duration_s": args.duration,
                     "settle_s": args.settle, "restarts": args.restarts, "quick": args.quick},
        "runs": runs, "medians": medians, "ratio_container_to_process": ratio})
    print(f"wrote {shown_path(args.out)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
