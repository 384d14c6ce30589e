"""Drive N simulated agents against one ``pitstop server`` process and measure report latency and backlog.

Before the server starts, the samples table gets ``--history-minutes`` (15) of the fleet's history, so the
policy rounds carry a production-sized window. Each agent reports every ``--interval`` seconds (8 GPUs and
8 replicas by default), on a schedule spread evenly over the interval, over a small pool of keep-alive
connections with bounded concurrency. A report that starts more than ``--late`` seconds after its scheduled
time counts as backlog. The load starts once the server's policy process has finished its first rounds
(the first reads the whole window); the rounds that run during the load are counted and timed from the
server's ``pitstop_cp_policy_round_seconds``. The first run also times one standalone pass (cold: the
whole window; warm: after one more interval of reports), split into snapshot and evaluation.

The load generator shares the machine's cores with the server (and the database), so figures on a small
machine are pessimistic for the server.

    python bench/cp_reports.py --backend sqlite --runs 3
    python bench/cp_reports.py --backend postgresql   # starts a throw-away PostgreSQL (Debian binaries)

``--mode failover`` kills the leader of two control planes under load and times the standby's first policy
round, counting reports lost; ``--mode storm`` restarts the control plane under the fleet, once with the agents'
old retry (fixed doubling) and once with today's (full jitter, Retry-After). ``bench/cp_failover.py`` says how.

    python bench/cp_reports.py --mode failover --backend postgresql
    python bench/cp_reports.py --mode storm --backend postgresql
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from glob import glob
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.wire import (  # noqa: E402
    PROTOCOL_VERSION,
    EngineSample,
    GpuSample,
    NodeReport,
    ProcessSample,
    ReplicaState,
    ReplicaStatus,
)
from bench.harness.figures import shown_path  # noqa: E402
from bench.harness.http import probe  # noqa: E402

TOKEN = "bench-agent-token"


def node_report(node: str, gpus: int, replicas: int, seq: int, at: datetime) -> NodeReport:
    return NodeReport(
        protocol_version=PROTOCOL_VERSION, node=node, hostname=f"{node}.bench", agent_version="bench",
        sent_at=at, sequence=seq,
        gpus=[GpuSample(index=i, uuid=f"GPU-{node}-{i}", name="NVIDIA H200", temperature_celsius=60 + i,
                        slowdown_temperature_celsius=89, memory_used_bytes=70 * 1024**3,
                        memory_total_bytes=141 * 1024**3, utilization_ratio=0.8, power_watts=450)
              for i in range(gpus)],
        replicas=[ReplicaStatus(
            name=f"r{k}", model=f"model-{k % 4}", url=f"http://127.0.0.1:{9000 + k}", state=ReplicaState.READY,
            ready=True, gpus=[k % max(gpus, 1)], generation=1, engine_args=["--max-num-seqs", "128"],
            state_since=at - timedelta(hours=1), log_tail=["INFO ok"],
            engine=EngineSample(requests_running=12, requests_waiting=1, kv_cache_usage_ratio=0.4,
                                ttft_p99_seconds=0.2, itl_p99_seconds=0.02, e2e_p99_seconds=3.0,
                                generation_tokens_per_second=900, requests_per_second=4, errors_per_second=0,
                                generation_tokens_total=1e6),
            process=ProcessSample(pid=1000 + k, rss_bytes=2 * 1024**3, cpu_percent=50, gpu_memory_bytes=60 * 1024**3),
            canary_ok=True, canary_ttft_seconds=0.1,
        ) for k in range(replicas)],
    )


def _template(node: str, gpus: int, replicas: int) -> str:
    """The report as JSON text with the sequence and time left as fields to fill (no per-send pydantic)."""
    stamp = datetime(2000, 1, 1, tzinfo=UTC)
    text = node_report(node, gpus, replicas, 777_777_777, stamp).model_dump_json()
    return text.replace('"sequence":777777777', '"sequence":{seq}').replace(
        '"sent_at":"2000-01-01T00:00:00Z"', '"sent_at":"{at}"')


def _pg_bin(name: str) -> str | None:
    candidates = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return shutil.which(name) or (candidates[-1] if candidates else None)


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def database(backend: str, port: int) -> Iterator[str]:
    work = Path(tempfile.mkdtemp(prefix="pitstop-bench-"))
    try:
        if backend == "sqlite":
            yield f"sqlite:///{work / 'bench.db'}"
            return
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise SystemExit("PostgreSQL server binaries are not installed")
        if os.geteuid() == 0:
            shutil.chown(work, "postgres")
        data = work / "data"
        subprocess.run(_as_postgres([initdb, "-D", str(data), "-U", "pitstop", "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True)
        opts = f"-p {port} -k {work} -c listen_addresses=127.0.0.1 -c max_connections=200"
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-o", opts, "-l", str(work / "pg.log"), "-w",
                                     "start"]), check=True, capture_output=True)
        try:
            yield f"postgresql+psycopg://pitstop@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def server(url: str, port: int, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PITSTOP_SERVER_AGENT_TOKENS": TOKEN,
           "PITSTOP_SERVER_RETENTION_INTERVAL_SECONDS": "3600"}
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "server", "--port", str(port), "--database-url",
                             url, "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=workdir)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if probe.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise SystemExit("server did not start: " + (workdir / "server.log").read_text()[-2000:])
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# Signals that are counts or settings: jittered as whole numbers, or not at all, as an engine reports them.
_WHOLE = {"requests_running", "requests_waiting", "generation_tokens_total", "preemptions_total", "rss_bytes",
          "gpu_memory_bytes", "memory_used_bytes", "xid_events_total", "ecc_uncorrected_total", "power_watts",
          "temperature_celsius"}
_FIXED = {"generation", "max_num_seqs", "flags_key", "canary_ok", "live_cap"}
# Memory moves by megabytes between readings, not by a fifth: jittered that much, a flat process would look like
# noise the leak detectors must fit a trend to.
_SMOOTH = {"rss_bytes", "gpu_memory_bytes", "memory_used_bytes"}
_VARIANTS = 97


# vLLM's default bucket bounds (tests/fixtures/vllm-0.32.0-cpu): TTFT, and inter-token latency.
_TTFT_BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BOUNDS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0]


def _window(rng: random.Random, ended: datetime) -> dict[str, object]:
    """A scrape window as the store keeps it (``EngineWindow`` as JSON): 10 to 30 requests' TTFTs and a few
    thousand inter-token latencies, in vLLM's buckets."""
    ttft, itl = [0.0] * (len(_TTFT_BOUNDS) + 1), [0.0] * (len(_ITL_BOUNDS) + 1)
    for _ in range(rng.randint(10, 30)):
        ttft[rng.randint(6, 11)] += 1
    for i in range(5):
        itl[i] = float(rng.randint(0, 1500))
    return {"ended_at": ended.isoformat().replace("+00:00", "Z"), "seconds": 5.0, "steps": float(rng.randint(300, 500)),
            "ttft": {"bounds": _TTFT_BOUNDS, "counts": ttft}, "itl": {"bounds": _ITL_BOUNDS, "counts": itl}}


def _variants(values: dict[str, object], seed: int, windows: bool = False) -> list[dict[str, object]]:
    """``_VARIANTS`` copies of one subject's values, each reading jittered as a live engine's would be (seeded),
    a replica's with its scrape window: the store's size depends on the values it holds, and identical ones would
    compress to almost nothing."""
    rng = random.Random(seed)
    out = []
    for _ in range(_VARIANTS):
        copy: dict[str, object] = {}
        for name, value in values.items():
            if isinstance(value, float) and name not in _FIXED:
                jittered = value * (rng.uniform(0.999, 1.001) if name in _SMOOTH else rng.uniform(0.8, 1.2))
                copy[name] = float(round(jittered)) if name in _WHOLE else jittered
            else:
                copy[name] = value
        if windows:
            copy["window"] = _window(rng, datetime.now(UTC) - timedelta(seconds=rng.uniform(0, 3600)))
        out.append(copy)
    return out


def seed_history(url: str, agents: int, gpus: int, replicas: int, interval: float, minutes: float) -> int:
    """Fill the samples store with ``minutes`` of history for the whole fleet, as if agents had reported every
    ``interval`` seconds, so the policy rounds carry a production-sized window (15 minutes is about 2.9
    million samples at 1,000 nodes); the number of samples written. Written in bulk: replaying it through the
    API would take longer than the benchmark. Readings are jittered (``_variants``).

    Stores of the layout before packed rows (one JSON row per subject) are seeded too, so the two can be
    measured side by side on the same readings."""
    from sqlalchemy import insert

    from controlplane.fleet.ingest import gpu_series_values
    from controlplane.policy.signals import stored_values
    from controlplane.store import models
    from controlplane.store.db import make_engine, migrate

    engine = make_engine(url)
    migrate(engine)
    now = datetime.now(UTC)
    template = node_report("node-0000", gpus, replicas, 1, now)
    subjects = ([("gpu", str(g.index), _variants(gpu_series_values(g), 1000 + g.index)) for g in template.gpus]
                + [("replica", r.name, _variants(stored_values(r), k, windows=True))
                   for k, r in enumerate(template.replicas)])
    packed = hasattr(models, "NodeSamples")
    steps = int(minutes * 60 / interval)
    written = 0
    try:
        for step in range(steps, 0, -1):
            rows: list[dict[str, object]] = []
            for i in range(agents):
                node = f"node-{i:04d}"
                at = now - timedelta(seconds=step * interval - interval * i / agents)
                items = [(kind, name, pool[(i * 7 + step * 13 + k) % _VARIANTS])
                         for k, (kind, name, pool) in enumerate(subjects)]
                if packed:
                    from controlplane.store.samples import node_row
                    rows.append(node_row(node, at, items) or {})
                else:
                    rows += [{"node": node, "subject_kind": kind, "subject": name, "at": at,
                              "resolution_seconds": 0, "values": values} for kind, name, values in items]
                written += len(items)
            with engine.begin() as conn:
                conn.execute(insert(models.NodeSamples if packed else models.Sample), rows)  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    return written


def store_bytes(url: str) -> int:
    """What the samples store takes on disk: the SQLite database with its write-ahead log, or PostgreSQL's samples
    table with its indexes and TOAST."""
    from sqlalchemy import text

    from controlplane.store import models
    from controlplane.store.db import make_engine

    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    table = "node_samples" if hasattr(models, "NodeSamples") else "samples"
    engine = make_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {table}"))  # dead tuples of the seed's own writes are not the store
            return int(conn.execute(text(f"SELECT pg_total_relation_size('{table}')")).scalar_one())
    finally:
        engine.dispose()


def policy_round_stats(base: str) -> dict[str, float]:
    """The server's own policy rounds and report batches so far, from its /metrics."""
    text = probe.get(f"{base}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        for family, key in (("pitstop_cp_policy_round_seconds", ""), ("pitstop_cp_report_batch_size", "batch_")):
            for part in ("sum", "count"):
                if line.startswith(f"{family}_{part} "):
                    values[key + part] = float(line.split()[-1])
    return values


def _cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class Connections:
    """Keep-alive HTTP/1.1 connections for the load: each report is written as prepared bytes and its answer
    read by Content-Length. A general client (httpx) cost this machine more CPU per report than the server
    it measures, and both share two cores."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: bytes) -> int:
        """POST ``body``; the answer's status (the body is read and dropped). A kept-alive connection the
        server closed while idle is retried once on a fresh one, as HTTP clients do."""
        request = (f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        if self._idle:
            reader, writer = self._idle.pop()
            try:
                return await self._exchange(reader, writer, request)
            except (OSError, asyncio.IncompleteReadError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise  # the server answered part of it: a real failure, not an idle close
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return await self._exchange(reader, writer, request)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
        except BaseException:
            writer.close()
            raise
        self._idle.append((reader, writer))
        return status

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def drive(base: str, agents: int, gpus: int, replicas: int, interval: float, duration: float,
                concurrency: int, late: float) -> dict[str, float | int]:
    templates = [_template(f"node-{i:04d}", gpus, replicas) for i in range(agents)]
    latencies: list[float] = []
    lateness: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(concurrency)
    address = httpx.URL(base)
    pool = Connections(address.host, address.port or 80)
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5
    rounds = max(1, int(duration / interval))
    # Sequence numbers from the loop's clock (ms since it started): they keep rising across calls, as one
    # agent's counter would.
    schedule = sorted((due, i, int(due * 1000)) for r in range(rounds) for i in range(agents)
                      if (due := start + r * interval + interval * i / agents))

    async def send(due: float, i: int, seq: int) -> None:
        nonlocal errors
        async with sem:
            began = loop.time()
            lateness.append(began - due)
            at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            body = templates[i].replace("{seq}", str(seq)).replace("{at}", at).encode()
            try:
                if await pool.post(f"/v1/agents/node-{i:04d}/report", body) != 200:
                    errors += 1
            except (OSError, asyncio.IncompleteReadError, ValueError):
                errors += 1
            latencies.append(loop.time() - began)

    tasks = []
    try:
        for due, i, seq in schedule:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(due, i, seq)))
        await asyncio.gather(*tasks)
    finally:
        pool.close()
    elapsed = loop.time() - start
    q = statistics.quantiles(latencies, n=100)
    return {"reports": len(latencies), "errors": errors, "seconds": round(elapsed, 1),
            "rate": round(len(latencies) / elapsed, 1), "p50_ms": round(q[49] * 1000, 1),
            "p99_ms": round(q[98] * 1000, 1), "late": sum(1 for x in lateness if x > late),
            "max_late_s": round(max(lateness), 2)}


def policy_pass(url: str, more_reports: Callable[[], object]) -> dict[str, float]:
    """One full policy pass over the fleet, as the leader runs it: cold (a new leader reads the whole
    history window into its cache), then warm (after one more report interval, reading only the new rows)."""
    from sqlalchemy.orm import Session

    from controlplane.policy import evaluate
    from controlplane.policy.guardrails import GuardConfig, decide
    from controlplane.policy_files import DEFAULTS_DIR, load_directory
    from controlplane.remediation.history import SampleHistory
    from controlplane.remediation.records import guard_state
    from controlplane.remediation.snapshot import build_snapshot
    from controlplane.store.db import make_engine, make_sessionmaker, session_scope

    class CountingHistory(SampleHistory):
        """The leader's cache, counting the rows each refresh read: the whole window cold, one interval warm."""

        rows_read = 0

        def refresh(self, session: Session, now: datetime, only: set[str] | None = None) -> int:
            self.rows_read = super().refresh(session, now, only)
            return self.rows_read

    policies = load_directory(DEFAULTS_DIR)
    engine = make_engine(url)
    cache = CountingHistory(timedelta(minutes=15))
    out: dict[str, float] = {}
    try:
        for phase in ("cold", "warm"):
            if phase == "warm":
                more_reports()
            with session_scope(make_sessionmaker(engine)) as session:
                now = datetime.now(UTC)
                t0 = time.perf_counter()
                snapshot = build_snapshot(session=session, now=now, samples=cache)
                t1 = time.perf_counter()
                proposed = evaluate(policies, snapshot, now)
                t2 = time.perf_counter()
                decide(proposed, guard_state(session=session, now=now), snapshot, now,
                       {p.name: p for p in policies}, GuardConfig())
                t3 = time.perf_counter()
            out |= {f"{phase}_snapshot_s": round(t1 - t0, 2), f"{phase}_evaluate_s": round(t2 - t1, 2),
                    f"{phase}_pass_s": round(t3 - t0, 2), f"{phase}_rows_read": cache.rows_read}
            out["proposed"] = len(proposed)
    finally:
        engine.dispose()
    out["replicas"] = len(snapshot.replicas)
    out["replica_samples"] = sum(len(r.history) for r in snapshot.replicas)
    out["gpu_samples"] = sum(len(g.history) for g in snapshot.gpus)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load per run")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--late", type=float, default=1.0, help="seconds behind schedule that count as backlog")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--no-policy-pass", action="store_true", help="skip the policy evaluation pass")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON document (default bench/results/cp_reports.<backend>.json)")
    p.add_argument("--history-minutes", type=float, default=15.0,
                   help="sample history written before the load, so policy rounds carry a full window")
    p.add_argument("--quick", action="store_true", help="50 agents, 2 minutes of history, 15 s of load, one run")
    p.add_argument("--mode", choices=["load", "failover", "storm"], default="load")
    p.add_argument("--settle", type=float, default=20.0, help="failover, storm: seconds of steady load first")
    p.add_argument("--after", type=float, default=10.0, help="failover: seconds of load after the first round")
    p.add_argument("--down", type=float, default=20.0, help="storm: seconds the control plane stays down")
    p.add_argument("--cold-standby", action="store_true",
                   help="failover: also run each failover with a standby that does not follow (as before)")
    args = p.parse_args()
    if args.quick:
        args.agents, args.history_minutes, args.duration, args.runs = 50, 2.0, 15.0, 1
    from tests.helpers import free_port

    if args.mode != "load":
        return resilience(args)

    results = []
    for run in range(args.runs):
        with database(args.backend, free_port()) as url, tempfile.TemporaryDirectory() as work:
            seeded_at = time.perf_counter()
            seeded = seed_history(url, args.agents, args.gpus, args.replicas, args.interval, args.history_minutes)
            seed_s = time.perf_counter() - seeded_at
            stored = store_bytes(url)
            replica_readings = seeded * args.replicas // max(1, args.replicas + args.gpus)
            size = {"store_bytes": stored, "bytes_per_sample": round(stored / max(1, seeded), 1),
                    # Every byte (the GPUs' samples included) charged to the replicas' readings.
                    "bytes_per_replica_reading": round(stored / max(1, replica_readings), 1),
                    "bytes_per_replica_hour": round(stored / max(1, replica_readings) * 3600 / args.interval)}
            port = free_port()
            base = f"http://127.0.0.1:{port}"

            def one_interval(base: str = base) -> object:
                return asyncio.run(drive(base, args.agents, args.gpus, args.replicas, args.interval,
                                         args.interval, args.concurrency, args.late))

            with server(url, port, Path(work)) as proc:
                # One round first so every node exists, and the leader's first (cold) policy round is over:
                # the measured rounds are steady state.
                one_interval()
                deadline = time.monotonic() + 300
                while policy_round_stats(base).get("count", 0) < 2 and time.monotonic() < deadline:
                    one_interval()  # reports keep coming while the leader reads its window
                before = policy_round_stats(base)
                # CPU seconds per report, for the server and for this load generator: on a shared machine
                # these say what one dedicated core could sustain, whatever else was running.
                server_cpu, client_cpu = _cpu(proc.pid), time.process_time()
                load = asyncio.run(drive(base, args.agents, args.gpus, args.replicas,
                                         args.interval, args.duration, args.concurrency, args.late))
                n = max(1, int(load["reports"]))
                load["server_cpu_ms"] = round((_cpu(proc.pid) - server_cpu) * 1000 / n, 2)
                load["client_cpu_ms"] = round((time.process_time() - client_cpu) * 1000 / n, 2)
                load["load_avg_1m"] = round(os.getloadavg()[0], 1)
                after = policy_round_stats(base)
                rounds = after.get("count", 0) - before.get("count", 0)
                load["server_rounds"] = rounds
                # Every round the leader completed while reports were arriving, the cold ones included: on a busy
                # host the duty cap can space rounds wider than a quick run's measured window.
                load["server_rounds_total"] = after.get("count", 0)
                load["server_round_mean_s"] = round((after.get("sum", 0) - before.get("sum", 0)) / rounds, 3) \
                    if rounds else 0.0
                load["server_first_rounds_s"] = round(before.get("sum", 0), 2)
                batches = after.get("batch_count", 0) - before.get("batch_count", 0)
                load["reports_per_commit"] = round(
                    (after.get("batch_sum", 0) - before.get("batch_sum", 0)) / batches, 2) if batches else 0.0
                # The standalone pass (its split into snapshot and evaluation) once: it reads the whole window
                # again, and the server's own rounds above already give the pass time of every run.
                passed = {} if args.no_policy_pass or run > 0 else policy_pass(url, one_interval)
            result = {"run": run + 1, "backend": args.backend, "seeded_samples": seeded, "seed_s": round(seed_s, 1),
                      **size, **load, **passed}
            print(json.dumps(result), flush=True)
            results.append(result)
    # Medians over what every run measured (the standalone pass is the first run's only).
    keys = [k for k, v in results[0].items() if isinstance(v, int | float) and k != "run"
            and all(k in r for r in results)]
    median = {k: statistics.median(float(r[k]) for r in results) for k in keys}
    print(json.dumps({"median_of": len(results), "backend": args.backend, **median}), flush=True)
    out = args.out or ROOT / "bench" / "results" / f"cp_reports.{args.backend}.json"
    out.write_text(json.dumps({"benchmark": "cp_reports", "settings": vars(args) | {"out": shown_path(out)},
                               "runs": results, "medians": median,
                               "note": "the load generator and the database share this host's cores with the "
                                       "server"}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def resilience(args: argparse.Namespace) -> int:
    """The failover or storm runs (``bench/cp_failover.py``), with medians, into bench/results."""
    from bench import cp_failover
    from tests.helpers import free_port

    results: list[dict[str, float | int | str]] = []
    for run in range(args.runs):
        with database(args.backend, free_port()) as url, tempfile.TemporaryDirectory() as work:
            seeded = seed_history(url, args.agents, args.gpus, args.replicas, args.interval, args.history_minutes)
            templates = [_template(f"node-{i:04d}", args.gpus, args.replicas) for i in range(args.agents)]
            if args.mode == "failover":
                outcomes: list[dict[str, float | int | str]] = [asyncio.run(cp_failover.failover(
                    url, templates, Path(work), (free_port(), free_port()), interval=args.interval,
                    settle=args.settle, after=args.after, concurrency=args.concurrency, warm=warm))
                    for warm in ([True, False] if args.cold_standby else [True])]
            else:
                outcomes = [asyncio.run(cp_failover.storm(url, templates, Path(work), free_port(),
                                                          interval=args.interval, settle=args.settle,
                                                          down=args.down, retry=retry,
                                                          concurrency=args.concurrency))
                            for retry in ("fixed", "jitter")]
        for outcome in outcomes:
            result = {"run": run + 1, "backend": args.backend, "mode": args.mode, "seeded_samples": seeded, **outcome}
            print(json.dumps(result), flush=True)
            results.append(result)
    groups: dict[str, list[dict[str, float | int | str]]] = {}
    for r in results:
        groups.setdefault(str(r.get("retry", r.get("standby", ""))), []).append(r)
    medians = {group or "all": {k: statistics.median(float(r[k]) for r in rs) for k, v in rs[0].items()
                                if isinstance(v, int | float) and k != "run"} for group, rs in groups.items()}
    print(json.dumps({"median_of": args.runs, "medians": medians}), flush=True)
    out = args.out or ROOT / "bench" / "results" / f"cp_{args.mode}.{args.backend}.json"
    out.write_text(json.dumps({"benchmark": f"cp_reports --mode {args.mode}",
                               "settings": vars(args) | {"out": shown_path(out)}, "runs": results,
                               "medians": medians, "note": "the load generator, the control planes and the "
                               "database share this host's cores"}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
