"""What the node agent costs: one ``pitstop agent`` process supervising N simulated replicas on N simulated GPUs.

Each run starts a control-plane stand-in (a FastAPI app in this process that records nothing and answers every
report with an empty desired state: the agent's side of the exchange is the same as with ``pitstop server``),
then the agent with ``--replicas`` ``pitstop sim serve`` engines, one per simulated GPU, scraping and
reporting every ``--interval`` seconds. Once every replica is READY and ``--warmup`` seconds have passed,
the agent process's own CPU time (user + system, its engines excluded: they are separate processes) is
read over ``--duration`` seconds, and its RSS sampled. The table shows each run and the medians.

    python bench/agent_cost.py                        # 8 replicas, 8 GPUs, 1 s, 3 runs of 60 s
    python bench/agent_cost.py --busy 2               # each engine also serves 2 requests/s (figures move)
    python bench/agent_cost.py --runs 1 --duration 20 --profile /tmp/agent.svg   # py-spy, if installed
    python bench/agent_cost.py --interval 5 --prometheus-every 15    # default intervals, scraped as in production

``--prometheus-every S`` adds a Prometheus stand-in: every S seconds it reads the agent's /metrics and each
replica's engine through the agent (``/engines/<replica>/metrics``, where the agent serves it), as the
``pitstop-agent`` and ``pitstop-engines`` jobs do, and the table adds the series per node it read.

Target (issue 3): under 1 % of one core and under 80 MB RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn
import yaml
from fastapi import FastAPI, Request, Response

ROOT = Path(__file__).resolve().parents[1]
TARGET_CPU_PERCENT = 1.0
TARGET_RSS_MB = 80.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


class StandIn:
    """Answers ``POST /v1/agents/{node}/report`` with an empty desired state; counts reports."""

    def __init__(self, node: str) -> None:
        self.reports = 0
        self.bytes = 0
        app = FastAPI()
        answer = f'{{"protocol_version": 1, "node": "{node}", "replicas": []}}'

        @app.post("/v1/agents/{name}/report")
        async def report(name: str, request: Request) -> Response:
            self.bytes += len(await request.body())
            self.reports += 1
            return Response(answer, media_type="application/json")

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        wait_until(lambda: self.server.started, 10, "control-plane stand-in")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Traffic:
    """``rps`` short completions per second to each engine from a thread of this process, so the engines'
    series move between scrapes (idle engines send the same /metrics body every time)."""

    def __init__(self, ports: list[int], rps: float) -> None:
        self.ports, self.rps = ports, rps
        self.stop = threading.Event()
        self.failed = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.wait(1.0 / self.rps):
                for port in self.ports:
                    try:
                        client.post(f"http://127.0.0.1:{port}/v1/completions",
                                    json={"model": "tiny", "prompt": "hi", "max_tokens": 4})
                    except httpx.HTTPError:
                        self.failed += 1

    def __enter__(self) -> Traffic:
        if self.rps > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=15)


class PrometheusStandIn:
    """Reads the agent's /metrics and every engine through the agent every ``every`` seconds, counting the
    samples of the last round (what Prometheus would store per node); an agent without the pass-through
    (404) is read for its own /metrics only."""

    def __init__(self, agent: str, replicas: list[str], every: float) -> None:
        self.agent, self.replicas, self.every = agent, replicas, every
        self.agent_series = self.engine_series = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _samples(text: str) -> int:
        return sum(1 for line in text.splitlines() if line and not line.startswith("#"))

    def scrape_once(self, client: httpx.Client) -> None:
        self.agent_series = self._samples(client.get(f"{self.agent}/metrics").text)
        engines = 0
        for name in self.replicas:
            answer = client.get(f"{self.agent}/engines/{name}/metrics")
            if answer.status_code == 200:
                engines += self._samples(answer.text)
        self.engine_series = engines

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    self.scrape_once(client)
                if self.stop.wait(self.every):
                    return

    def __enter__(self) -> PrometheusStandIn:
        if self.every > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=15)


@dataclass
class RunResult:
    cpu_percent: float
    rss_mb: float
    reports_per_second: float
    report_kb: float
    agent_series: int = 0
    engine_series: int = 0


def agent_config(tmp: Path, replicas: int, gpus: int, interval: float, cp_port: int) -> dict[str, Any]:
    return {
        "node": "bench-node", "port": free_port(), "control_plane": f"http://127.0.0.1:{cp_port}",
        "gpu_backend": "sim", "sim_gpu_dir": str(tmp / "simgpu"), "sim_gpu_count": gpus,
        "state_dir": str(tmp / "state"), "scrape_interval": interval, "report_interval": interval,
        "replicas": [{"name": f"r{i}", "model": "tiny", "port": free_port(), "gpus": [i % gpus],
                      "args": ["--sim-startup-seconds", "0.5", "--sim-profile", "tiny-cpu"],
                      "warmup": {"requests": 1, "max_tokens": 2}, "stop_timeout": 10}
                     for i in range(replicas)],
    }


def one_run(args: argparse.Namespace, n: int) -> RunResult:
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-agent-cost-"))
    try:
        with StandIn("bench-node") as cp:
            config = agent_config(tmp, args.replicas, args.gpus, args.interval, cp.port)
            (tmp / "agent.yaml").write_text(yaml.safe_dump(config))
            env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
            log = (tmp / "agent.out").open("wb")
            proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "agent", "--config",
                                     str(tmp / "agent.yaml"), "--log-level", "WARNING"],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{config['port']}"
            try:
                def all_ready() -> bool:
                    try:
                        states = [r["state"] for r in httpx.get(f"{url}/v1/replicas", timeout=5).json()]
                    except (httpx.HTTPError, ValueError):
                        return False
                    return len(states) == args.replicas and all(s == "READY" for s in states)

                wait_until(all_ready, 120, "every replica READY")
                names = [r["name"] for r in config["replicas"]]
                with Traffic([r["port"] for r in config["replicas"]], args.busy), \
                        PrometheusStandIn(url, names, args.prometheus_every) as prometheus:
                    time.sleep(args.warmup)
                    agent = psutil.Process(proc.pid)
                    profiler = None
                    if args.profile:
                        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
                        kind = "flamegraph" if args.profile.endswith(".svg") else "raw"
                        profiler = subprocess.Popen([spy, "record", "-o", args.profile, "--pid", str(proc.pid),
                                                     "--duration", str(int(args.duration)), "--rate", "200",
                                                     "--format", kind],
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    t0, c0, r0, b0 = time.monotonic(), agent.cpu_times(), cp.reports, cp.bytes
                    rss: list[int] = []
                    while time.monotonic() - t0 < args.duration:
                        rss.append(agent.memory_info().rss)
                        time.sleep(min(5.0, args.duration / 4))
                    t1, c1, r1, b1 = time.monotonic(), agent.cpu_times(), cp.reports, cp.bytes
                    rss.append(agent.memory_info().rss)
                    if profiler is not None:
                        profiler.wait(timeout=60)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = t1 - t0
    cpu = ((c1.user - c0.user) + (c1.system - c0.system)) / elapsed * 100.0
    reports = r1 - r0
    result = RunResult(cpu, max(rss) / 2**20, reports / elapsed, (b1 - b0) / max(1, reports) / 1024,
                       prometheus.agent_series, prometheus.engine_series)
    scraped = (f", scraped {result.agent_series} agent + {result.engine_series} engine series"
               if args.prometheus_every > 0 else "")
    print(f"run {n}: cpu {result.cpu_percent:.2f} % of a core, rss {result.rss_mb:.1f} MB, "
          f"{result.reports_per_second:.2f} reports/s of {result.report_kb:.1f} kB{scraped}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0, help="scrape and report interval, seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after READY before measuring")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=float, default=0.0, help="requests per second to each engine (0: idle)")
    parser.add_argument("--prometheus-every", type=float, default=0.0,
                        help="seconds between a Prometheus stand-in's scrapes of the agent and its engines (0: off)")
    parser.add_argument("--profile", default=None,
                        help="py-spy profile of the last run: a flame graph (.svg) or collapsed stacks (other)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the agent and its engines on the way out
    results = [one_run(args, n + 1) for n in range(args.runs)]
    cpu = statistics.median(r.cpu_percent for r in results)
    rss = statistics.median(r.rss_mb for r in results)
    print()
    load = f"{args.busy:g} requests/s per engine" if args.busy else "idle engines"
    print(f"agent cost: {args.replicas} replicas, {args.gpus} GPUs, {args.interval:g} s interval, {load}, "
          f"{args.runs} runs of {args.duration:g} s")
    print(f"{'figure':<22}{'median':>10}{'runs':>28}{'target':>10}  ok")
    print(f"{'CPU % of one core':<22}{cpu:>10.2f}{' '.join(f'{r.cpu_percent:.2f}' for r in results):>28}"
          f"{'< ' + str(TARGET_CPU_PERCENT):>10}  {'yes' if cpu < TARGET_CPU_PERCENT else 'NO'}")
    print(f"{'RSS MB':<22}{rss:>10.1f}{' '.join(f'{r.rss_mb:.1f}' for r in results):>28}"
          f"{'< ' + str(TARGET_RSS_MB):>10}  {'yes' if rss < TARGET_RSS_MB else 'NO'}")
    if args.prometheus_every > 0:
        print(f"{'series per node':<22}{results[-1].agent_series + results[-1].engine_series:>10}"
              f"{'agent ' + str(results[-1].agent_series) + ' + engines ' + str(results[-1].engine_series):>28}")
    return 0 if cpu < TARGET_CPU_PERCENT and rss < TARGET_RSS_MB else 1


if __name__ == "__main__":
    sys.exit(main())
