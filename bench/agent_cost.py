"""What the node agent costs: one ``pitstop agent`` process supervising N simulated replicas, beside node_exporter.

Each run starts a control-plane stand-in (a loopback HTTP server in this process that records nothing and
answers every report with an empty desired state: the agent's side of the exchange is the same as with
``pitstop server``), then the agent with ``--replicas`` ``pitstop sim serve`` engines, scraping and reporting
every ``--interval`` seconds, and, side by side, Debian's ``prometheus-node-exporter`` (its default collectors,
on a loopback port). Once every replica is READY and ``--warmup`` seconds have passed, the CPU time (user +
system) of the agent process (its engines excluded: they are separate processes) and of node_exporter is read
over the same ``--duration`` seconds, and their RSS sampled. The table shows each run, the medians and the ratio
agent / node_exporter, per run and as a median.

    python bench/agent_cost.py                        # 8 replicas, 8 simulated GPUs, 1 s, 3 runs of 60 s
    python bench/agent_cost.py --interval 5 --prometheus-every 15            # default intervals, as in production
    python bench/agent_cost.py --interval 5 --prometheus-every 15 --node-exporter-every 1
    python bench/agent_cost.py --busy 2               # each engine also serves 2 requests/s (figures move)
    python bench/agent_cost.py --gpu nvml             # the real GPUs through NVML; engines still simulated
    python bench/agent_cost.py --runs 1 --duration 20 --profile agent.svg   # py-spy, if installed

Scrapes. ``--prometheus-every S`` adds a Prometheus stand-in: every S seconds it reads the agent's /metrics and
each replica's engine through the agent (``/engines/<replica>/metrics``), as the ``pitstop-agent`` and
``pitstop-engines`` jobs do, and the table adds the series per node it read. node_exporter is read every
``--node-exporter-every`` seconds: by default at the stand-in's interval, or without one at ``--interval`` (the
agent scrapes its engines and reports that often), so the plain 1 s run sets the agent working every second
against node_exporter scraped every second. "Default intervals" are the agent's own (``scrape_interval`` and
``report_interval`` 5 s) with Prometheus's usual 15 s; node_exporter's usual production scrape is 15 s too, and
``--node-exporter-every 1`` compares with node_exporter scraped every second instead. Say which one a figure
is. ``--canary-every N`` sets the agent's ``canary_every`` (0: no canaries), to see what the canaries cost.

node_exporter: ``apt-get install prometheus-node-exporter`` (Debian, Ubuntu; do not enable the service, the
benchmark starts its own), or any node_exporter binary with ``--node-exporter PATH``. Without one the agent is
measured alone and the table says so.

``--gpu nvml`` starts the agent with the NVML backend and the host's GPU indices (``--gpus`` defaults to every
GPU NVML sees; replica i runs on GPU i mod that count); the engines are still the simulator, on those indices.

Targets: under 1 % of one core and under 80 MB RSS (issue 3); under 0.8x node_exporter's CPU at 1 s, and under
0.2x at the agent's default intervals against node_exporter read every second.

This script imports only the standard library, httpx and psutil (and pynvml for ``--gpu nvml``); the agent it
starts needs the project installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.figures import shown_path, write_json  # noqa: E402  (the standard library only)
from bench.harness.http import probe  # noqa: E402
from bench.harness.ports import free_port  # noqa: E402  (the standard library only)

TARGET_CPU_PERCENT = 1.0
TARGET_RSS_MB = 80.0
NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node_exporter")
NODE_EXPORTER_MISSING = ("node_exporter not found: the agent is measured alone. For the side-by-side figure install "
                         "it (Debian, Ubuntu: `apt-get install -y prometheus-node-exporter`, without enabling the "
                         "service: the benchmark starts its own) or pass --node-exporter PATH to a node_exporter "
                         "binary (https://github.com/prometheus/node_exporter/releases).")


def wait_until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


class StandIn:
    """Answers ``POST /v1/agents/{node}/report`` with ``answer`` (an empty desired state unless set) on keep-alive
    HTTP/1.1 connections (as uvicorn does); counts reports and their bytes."""

    def __init__(self, node: str) -> None:
        self.reports = 0
        self.bytes = 0
        self.answer = f'{{"protocol_version": 1, "node": "{node}", "replicas": []}}'.encode()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                size = len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                found = self.path.startswith("/v1/agents/") and self.path.endswith("/report")
                if found:
                    stand_in.bytes += size
                    stand_in.reports += 1
                body = stand_in.answer if found else b'{"detail": "Not Found"}'
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


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


class Scraper:
    """A Prometheus stand-in: every ``every`` seconds it GETs each of ``urls`` (a 404 is skipped: an agent
    without the pass-through is read for its own /metrics only), counting the samples of the last round per URL
    (what Prometheus would store)."""

    def __init__(self, urls: list[str], every: float) -> None:
        self.urls, self.every = urls, every
        self.series: list[int] = [0] * len(urls)
        self.rounds = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _samples(text: str) -> int:
        return sum(1 for line in text.splitlines() if line and not line.startswith("#"))

    def scrape_once(self, client: httpx.Client) -> None:
        for n, url in enumerate(self.urls):
            answer = client.get(url)
            self.series[n] = self._samples(answer.text) if answer.status_code == 200 else 0
        self.rounds += 1

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    self.scrape_once(client)
                if self.stop.wait(self.every):
                    return

    def __enter__(self) -> Scraper:
        if self.every > 0 and self.urls:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=15)


def find_node_exporter(given: str | None) -> str | None:
    """The node_exporter binary: ``given``, else on PATH or in /usr/bin under Debian's or upstream's name."""
    if given:
        return given if Path(given).is_file() else shutil.which(given)
    for name in NODE_EXPORTER_NAMES:
        found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin:/usr/local/bin")
        if found:
            return found
    return None


class NodeExporter:
    """node_exporter with its default collectors on a loopback port, in its own process group, always stopped."""

    def __init__(self, binary: str, log: Path) -> None:
        self.binary, self.log_path = binary, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> NodeExporter:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen([self.binary, f"--web.listen-address=127.0.0.1:{self.port}"],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"node_exporter exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text()[-2000:]}")
            try:
                return probe.get(self.url, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, 30, "node_exporter")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class RunResult:
    cpu_percent: float
    rss_mb: float
    reports_per_second: float
    report_kb: float
    agent_series: int = 0
    engine_series: int = 0
    node_exporter_cpu_percent: float | None = None
    node_exporter_rss_mb: float | None = None
    node_exporter_series: int = 0

    @property
    def ratio(self) -> float | None:
        """Agent CPU / node_exporter CPU over the same window (None without node_exporter)."""
        ne = self.node_exporter_cpu_percent
        return self.cpu_percent / ne if ne else None


def gpu_count(kind: str, given: int | None) -> int:
    """How many GPUs the replicas are spread over: ``given``, else 8 simulated ones or every GPU NVML sees."""
    if given is not None:
        return given
    if kind == "sim":
        return 8
    import pynvml  # nvidia-ml-py: only on a GPU host

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def agent_config(tmp: Path, replicas: int, gpus: int, interval: float, cp_port: int,
                 gpu: str = "sim", canary_every: int | None = None) -> dict[str, Any]:
    backend: dict[str, Any] = ({"gpu_backend": "sim", "sim_gpu_count": gpus} if gpu == "sim" else
                               {"gpu_backend": "nvml"})
    return {
        "node": "bench-node", "port": free_port(), "control_plane": f"http://127.0.0.1:{cp_port}",
        **backend, "sim_gpu_dir": str(tmp / "simgpu"),
        "state_dir": str(tmp / "state"), "scrape_interval": interval, "report_interval": interval,
        **({} if canary_every is None else {"canary_every": canary_every}),
        "replicas": [{"name": f"r{i}", "model": "tiny", "port": free_port(), "gpus": [i % gpus],
                      "args": ["--sim-startup-seconds", "0.5", "--sim-profile", "tiny-cpu"],
                      "warmup": {"requests": 1, "max_tokens": 2}, "stop_timeout": 10}
                     for i in range(replicas)],
    }


def environment(gpu: str) -> dict[str, Any]:
    """Where the measured agent's packages come from. A host installs the agent extra into its own virtual
    environment; run from a system interpreter (a GPU host's ML stack, say), the agent also loads that
    environment's packages (another pynvml, rich), and they count in its RSS: 78.6 against 74.8 MB on the H200."""
    from importlib import metadata

    env: dict[str, Any] = {"own_virtual_environment": sys.prefix != sys.base_prefix}
    if gpu == "nvml":
        try:
            env["nvidia_ml_py"] = metadata.version("nvidia-ml-py")
        except metadata.PackageNotFoundError:  # a pynvml from elsewhere
            env["nvidia_ml_py"] = None
    return env


def cpu_seconds(times: Any) -> float:
    return float(times.user + times.system)


def one_run(args: argparse.Namespace, n: int, node_exporter: str | None) -> RunResult:
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-agent-cost-"))
    ne_every = args.node_exporter_every or args.prometheus_every or args.interval
    try:
        with StandIn("bench-node") as cp, contextlib.ExitStack() as stack:
            exporter = stack.enter_context(NodeExporter(node_exporter, tmp / "node_exporter.out")) \
                if node_exporter else None
            config = agent_config(tmp, args.replicas, args.gpus, args.interval, cp.port, args.gpu, args.canary_every)
            # JSON is YAML: the agent reads it as its YAML config file.
            (tmp / "agent.yaml").write_text(json.dumps(config, indent=1))
            env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
            log = (tmp / "agent.out").open("wb")
            proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "agent", "--config",
                                     str(tmp / "agent.yaml"), "--log-level", "WARNING"],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{config['port']}"
            try:
                def all_ready() -> bool:
                    if proc.poll() is not None:
                        raise RuntimeError(f"the agent exited with {proc.returncode}: "
                                           f"{(tmp / 'agent.out').read_text()[-3000:]}")
                    try:
                        states = [r["state"] for r in probe.get(f"{url}/v1/replicas", timeout=5).json()]
                    except (httpx.HTTPError, ValueError):
                        return False
                    return len(states) == args.replicas and all(s == "READY" for s in states)

                wait_until(all_ready, 120, "every replica READY")
                names = [r["name"] for r in config["replicas"]]
                agent_urls = [f"{url}/metrics", *(f"{url}/engines/{name}/metrics" for name in names)]
                with Traffic([r["port"] for r in config["replicas"]], args.busy), \
                        Scraper(agent_urls, args.prometheus_every) as prometheus, \
                        Scraper([exporter.url] if exporter else [], ne_every) as ne_scraper:
                    time.sleep(args.warmup)
                    agent = psutil.Process(proc.pid)
                    ne = psutil.Process(exporter.proc.pid) if exporter and exporter.proc else None
                    profiler = None
                    if args.profile:
                        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
                        kind = "flamegraph" if args.profile.endswith(".svg") else "raw"
                        profiler = subprocess.Popen([spy, "record", "-o", args.profile, "--pid", str(proc.pid),
                                                     "--duration", str(int(args.duration)), "--rate", "200",
                                                     "--format", kind],
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    t0, c0, r0, b0 = time.monotonic(), agent.cpu_times(), cp.reports, cp.bytes
                    n0 = ne.cpu_times() if ne else None
                    rss: list[int] = []
                    ne_rss: list[int] = []
                    while time.monotonic() - t0 < args.duration:
                        rss.append(agent.memory_info().rss)
                        if ne:
                            ne_rss.append(ne.memory_info().rss)
                        time.sleep(min(5.0, args.duration / 4))
                    t1, c1, r1, b1 = time.monotonic(), agent.cpu_times(), cp.reports, cp.bytes
                    n1 = ne.cpu_times() if ne else None
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
    cpu = (cpu_seconds(c1) - cpu_seconds(c0)) / elapsed * 100.0
    system = (c1.system - c0.system) / elapsed * 100.0
    reports = r1 - r0
    result = RunResult(cpu, max(rss) / 2**20, reports / elapsed, (b1 - b0) / max(1, reports) / 1024,
                       prometheus.series[0] if prometheus.series else 0, sum(prometheus.series[1:]))
    if n0 is not None and n1 is not None:
        result.node_exporter_cpu_percent = (cpu_seconds(n1) - cpu_seconds(n0)) / elapsed * 100.0
        result.node_exporter_rss_mb = max(ne_rss, default=0) / 2**20
        result.node_exporter_series = ne_scraper.series[0]
    scraped = (f", scraped {result.agent_series} agent + {result.engine_series} engine series"
               if args.prometheus_every > 0 else "")
    beside = (f"; node_exporter {result.node_exporter_cpu_percent:.2f} % (read every {ne_every:g} s), "
              f"ratio {result.ratio:.2f}" if result.ratio is not None else "")
    print(f"run {n}: cpu {result.cpu_percent:.2f} % of a core ({system:.2f} system), rss {result.rss_mb:.1f} MB, "
          f"{result.reports_per_second:.2f} reports/s of {result.report_kb:.1f} kB{scraped}{beside}", flush=True)
    return result


def median_of(values: list[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--gpu", choices=("sim", "nvml"), default="sim",
                        help="the agent's GPU backend: simulated GPUs, or the host's through NVML")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs the replicas are spread over (default: 8 simulated, or every NVML GPU)")
    parser.add_argument("--interval", type=float, default=1.0, help="scrape and report interval, seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after READY before measuring")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--canary-every", type=int, default=None,
                        help="the agent's canary_every, in scrapes (default: its canary_interval, 5 s; 0: off)")
    parser.add_argument("--busy", type=float, default=0.0, help="requests per second to each engine (0: idle)")
    parser.add_argument("--prometheus-every", type=float, default=0.0,
                        help="seconds between a Prometheus stand-in's scrapes of the agent and its engines (0: off)")
    parser.add_argument("--node-exporter", default=None, help="node_exporter binary (default: found on PATH)")
    parser.add_argument("--node-exporter-every", type=float, default=None,
                        help="seconds between scrapes of node_exporter (default: --prometheus-every, else --interval)")
    parser.add_argument("--no-node-exporter", action="store_true", help="measure the agent alone")
    parser.add_argument("--quick", action="store_true",
                        help="one short run, exit status 0 whatever it measured (a smoke test, not a figure)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "agent_cost.json",
                        help="the JSON document: settings, every run, medians")
    parser.add_argument("--profile", default=None,
                        help="py-spy profile of the last run: a flame graph (.svg) or collapsed stacks (other)")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.duration, args.warmup = 1, 10.0, 3.0
    args.gpus = gpu_count(args.gpu, args.gpus)
    node_exporter = None if args.no_node_exporter else find_node_exporter(args.node_exporter)
    if node_exporter is None and not args.no_node_exporter:
        print(NODE_EXPORTER_MISSING, flush=True)
    env = environment(args.gpu)
    if not env["own_virtual_environment"]:
        print("note: not run from a virtual environment; the system's packages the agent loads count in its RSS",
              flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the agent and its engines on the way out
    results = [one_run(args, n + 1, node_exporter) for n in range(args.runs)]
    cpu = statistics.median(r.cpu_percent for r in results)
    rss = statistics.median(r.rss_mb for r in results)
    ne_cpu = median_of([r.node_exporter_cpu_percent for r in results])
    ratio = median_of([r.ratio for r in results])
    ne_every = args.node_exporter_every or args.prometheus_every or args.interval
    print()
    load = f"{args.busy:g} requests/s per engine" if args.busy else "idle engines"
    scraped = (f"Prometheus stand-in every {args.prometheus_every:g} s" if args.prometheus_every > 0 else
               "no Prometheus stand-in")
    print(f"agent cost: {args.replicas} replicas, {args.gpus} {'NVML' if args.gpu == 'nvml' else 'simulated'} GPUs, "
          f"{args.interval:g} s interval, {load}, {scraped}, {args.runs} runs of {args.duration:g} s")
    print(f"{'figure':<26}{'median':>10}{'runs':>28}{'target':>10}  ok")

    def row(name: str, value: float | None, values: list[float | None], target: float | None = None) -> None:
        shown = " ".join("-" if v is None else f"{v:.2f}" for v in values)
        met = "" if target is None or value is None else ("yes" if value < target else "NO")
        print(f"{name:<26}{'-' if value is None else f'{value:.2f}':>10}{shown:>28}"
              f"{'' if target is None else '< ' + f'{target:g}':>10}  {met}")

    row("CPU % of one core", cpu, [r.cpu_percent for r in results], TARGET_CPU_PERCENT)
    row("RSS MB", rss, [r.rss_mb for r in results], TARGET_RSS_MB)
    if node_exporter:
        row(f"node_exporter CPU % ({ne_every:g} s)", ne_cpu, [r.node_exporter_cpu_percent for r in results])
        row("node_exporter RSS MB", median_of([r.node_exporter_rss_mb for r in results]),
            [r.node_exporter_rss_mb for r in results])
        row("agent / node_exporter", ratio, [r.ratio for r in results])
    else:
        print("node_exporter: not measured (see above)")
    if args.prometheus_every > 0:
        print(f"{'series per node':<26}{results[-1].agent_series + results[-1].engine_series:>10}"
              f"{'agent ' + str(results[-1].agent_series) + ' + engines ' + str(results[-1].engine_series):>28}")
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "profile")}
    settings["node_exporter"] = Path(node_exporter).name if node_exporter else None
    settings["node_exporter_every"] = ne_every if node_exporter else None
    settings["environment"] = env
    write_json(args.out, "agent_cost", {
        "settings": settings, "runs": [{**asdict(r), "ratio": r.ratio} for r in results],
        "medians": {"cpu_percent": cpu, "rss_mb": rss, "node_exporter_cpu_percent": ne_cpu, "ratio": ratio}})
    print(f"wrote {shown_path(args.out)}")
    if args.quick:
        return 0  # a smoke test: the figures of one short run on a shared host are no verdict
    return 0 if cpu < TARGET_CPU_PERCENT and rss < TARGET_RSS_MB else 1


if __name__ == "__main__":
    sys.exit(main())
