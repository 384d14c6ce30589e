"""Drive N simulated agents against one ``pitstop server`` process and measure report latency and backlog.

Each agent reports every ``--interval`` seconds (8 GPUs and 8 replicas by default), on a schedule spread
evenly over the interval; an async httpx client with bounded concurrency sends them. A report that starts
more than ``--late`` seconds after its scheduled time counts as backlog. After the load, one full policy
evaluation pass runs over the same database: ``build_snapshot`` for the whole fleet, ``evaluate`` and
``decide`` with the default policies, timed.

The load generator shares the machine's cores with the server (and the database), so figures on a small
machine are pessimistic for the server.

    python bench/cp_reports.py --backend sqlite --agents 1000 --duration 30 --runs 3
    python bench/cp_reports.py --backend postgresql   # starts a throw-away PostgreSQL (Debian binaries)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
    found = shutil.which(name) or (sorted(glob(f"/usr/lib/postgresql/*/bin/{name}")) or [None])[-1]
    return found


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
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
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


def _cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def drive(base: str, agents: int, gpus: int, replicas: int, interval: float, duration: float,
                concurrency: int, late: float) -> dict[str, float | int]:
    templates = [_template(f"node-{i:04d}", gpus, replicas) for i in range(agents)]
    latencies: list[float] = []
    lateness: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30, headers=headers) as client:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.5
        rounds = max(1, int(duration / interval))
        schedule = sorted((start + r * interval + interval * i / agents, i, r + 1)
                          for r in range(rounds) for i in range(agents))

        async def send(due: float, i: int, seq: int) -> None:
            nonlocal errors
            async with sem:
                began = loop.time()
                lateness.append(began - due)
                at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                try:
                    r = await client.post(f"/v1/agents/node-{i:04d}/report",
                                          content=templates[i].replace("{seq}", str(seq)).replace("{at}", at))
                    if r.status_code != 200:
                        errors += 1
                except httpx.HTTPError:
                    errors += 1
                latencies.append(loop.time() - began)

        tasks = []
        for due, i, seq in schedule:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(due, i, seq)))
        await asyncio.gather(*tasks)
        elapsed = loop.time() - start
    q = statistics.quantiles(latencies, n=100)
    return {"reports": len(latencies), "errors": errors, "seconds": round(elapsed, 1),
            "rate": round(len(latencies) / elapsed, 1), "p50_ms": round(q[49] * 1000, 1),
            "p99_ms": round(q[98] * 1000, 1), "late": sum(1 for x in lateness if x > late),
            "max_late_s": round(max(lateness), 2)}


def policy_pass(url: str) -> dict[str, float]:
    from controlplane.policy import evaluate
    from controlplane.policy.guardrails import GuardConfig, decide
    from controlplane.policy.loader import DEFAULTS_DIR, load_directory
    from controlplane.remediation.records import guard_state
    from controlplane.remediation.snapshot import build_snapshot
    from controlplane.store.db import make_engine, make_sessionmaker, session_scope

    policies = load_directory(DEFAULTS_DIR)
    engine = make_engine(url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            now = datetime.now(UTC)
            t0 = time.perf_counter()
            snapshot = build_snapshot(session=session, now=now)
            t1 = time.perf_counter()
            proposed = evaluate(policies, snapshot, now)
            t2 = time.perf_counter()
            decide(proposed, guard_state(session=session, now=now), snapshot, now,
                   {p.name: p for p in policies}, GuardConfig())
            t3 = time.perf_counter()
    finally:
        engine.dispose()
    samples = sum(len(r.history) for r in snapshot.replicas)
    return {"replicas": len(snapshot.replicas), "replica_samples": samples, "snapshot_s": round(t1 - t0, 2),
            "evaluate_s": round(t2 - t1, 2), "decide_s": round(t3 - t2, 2), "pass_s": round(t3 - t0, 2),
            "proposed": len(proposed)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per run")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--late", type=float, default=1.0, help="seconds behind schedule that count as backlog")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--no-policy-pass", action="store_true", help="skip the policy evaluation pass")
    args = p.parse_args()
    from tests.helpers import free_port

    results = []
    for run in range(args.runs):
        with database(args.backend, free_port()) as url, tempfile.TemporaryDirectory() as work:
            port = free_port()
            with server(url, port, Path(work)) as proc:
                # One round first so every node exists: the measured rounds are steady state.
                asyncio.run(drive(f"http://127.0.0.1:{port}", args.agents, args.gpus, args.replicas,
                                  args.interval, args.interval, args.concurrency, args.late))
                # CPU seconds per report, for the server and for this load generator: on a shared machine
                # these say what one dedicated core could sustain, whatever else was running.
                server_cpu, client_cpu = _cpu(proc.pid), time.process_time()
                load = asyncio.run(drive(f"http://127.0.0.1:{port}", args.agents, args.gpus, args.replicas,
                                         args.interval, args.duration, args.concurrency, args.late))
                n = max(1, int(load["reports"]))
                load["server_cpu_ms"] = round((_cpu(proc.pid) - server_cpu) * 1000 / n, 2)
                load["client_cpu_ms"] = round((time.process_time() - client_cpu) * 1000 / n, 2)
                load["load_avg_1m"] = round(os.getloadavg()[0], 1)
            passed = {} if args.no_policy_pass else policy_pass(url)
            result = {"run": run + 1, "backend": args.backend, **load, **passed}
            print(json.dumps(result), flush=True)
            results.append(result)
    if len(results) > 1:
        keys = [k for k, v in results[0].items() if isinstance(v, int | float) and k != "run"]
        median = {k: statistics.median(float(r[k]) for r in results) for k in keys}
        print(json.dumps({"median_of": len(results), "backend": args.backend, **median}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
