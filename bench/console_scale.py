"""How long the console takes to become usable on a big fleet, in real Chromium: today's pages against the
one-page console they replaced (commit 28e5090), on the same control plane.

The fleet: ``--nodes`` (1,000) simulated agents of ``--replicas`` (8) replicas and 8 GPUs each, each sending two
reports of the agent's wire shape (``agent.wire.NodeReport``) through ``POST /v1/agents/{node}/report``, so
the store holds what real agents leave: nodes, GPUs, replicas, their samples and events. The policy loop is
off (``policies_enabled: false``): the figures are the console's and its API reads', not the policy rounds'.

**Interactive**, as timed here: from ``page.goto`` in a fresh browser session until the page's main content is
on screen with data and Streamlit has finished the run (no "running" indicator, no element of an earlier run
left stale):

- Fleet page: the model cards (``… of … serving``) and the "What Pitstop did last" section;
- Replicas page: the replicas table with its rows;
- the old console, one page for everything: its Replicas table with rows (it renders the whole page in one run;
  the run ends after every section, the replica history chart included).

Each console reads with a token given by environment (no sign-in form in the timing) and refreshes every 600 s
(no timer re-run inside a measurement); a wait longer than the console's read cache separates two loads, so each
reads the API afresh. Medians of ``--runs`` (3). Targets: Fleet < 2 s, Replicas < 3 s.

    python bench/console_scale.py [--nodes 1000] [--runs 3] [--out bench/results/console_scale.json]
    python bench/console_scale.py --nodes 20 --runs 1     # smoke
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

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
from bench.harness.figures import shown_path, write_json  # noqa: E402
from tests.console import stack as s  # noqa: E402

OLD_CONSOLE = "28e5090"
GIB = 1024**3
TARGETS = {"fleet": 2.0, "replicas": 3.0}
# Longer than the console's read cache (reads.READ_TTL_SECONDS): every load reads the API afresh.
BETWEEN_LOADS_S = 3.0
LOAD_TIMEOUT_MS = 300_000

SETTLED = f"!document.querySelector('{s.RUNNING}') && !document.querySelector('{s.STALE}')"
GRID_HAS_ROWS = """(column) => [...document.querySelectorAll('[data-testid="stDataFrame"] table[role="grid"]')]
  .some(t => [...t.querySelectorAll('th')].some(th => th.textContent.trim() === column)
             && t.querySelectorAll('tbody tr').length > 0)"""
READY = {
    "fleet": f"""() => [...document.querySelectorAll('[data-testid="stMarkdown"]')]
                       .some(e => e.textContent.includes(' serving'))
                   && [...document.querySelectorAll('h3')].some(e => e.textContent.includes('What Pitstop did last'))
                   && {SETTLED}""",
    "replicas": f"() => ({GRID_HAS_ROWS})('RSS MiB') && {SETTLED}",
    "old": f"() => ({GRID_HAS_ROWS})('TTFT p99 ms') && {SETTLED}",
}


def node_report(i: int, gpus: int, replicas: int, sequence: int, at: datetime) -> NodeReport:
    """Node ``i``'s report: 8 GPUs and ``replicas`` replicas over 4 models, readings that differ by replica."""
    node = f"node-{i:04d}"
    return NodeReport(
        protocol_version=PROTOCOL_VERSION, node=node, hostname=f"{node}.example", agent_version="0.1.0",
        sent_at=at, sequence=sequence,
        gpus=[GpuSample(index=g, uuid=f"GPU-{node}-{g}", name="NVIDIA H200", temperature_celsius=55 + (i + g) % 25,
                        slowdown_temperature_celsius=89, memory_used_bytes=(60 + g) * GIB,
                        memory_total_bytes=141 * GIB, utilization_ratio=0.7, power_watts=420 + g,
                        power_limit_watts=700) for g in range(gpus)],
        replicas=[ReplicaStatus(
            name=f"r{k}", model=f"model-{k % 4}", url=f"http://10.0.{i % 250}.{k}:8000", state=ReplicaState.READY,
            ready=True, gpus=[k % max(gpus, 1)], generation=1, engine_args=["--max-num-seqs", "128"],
            state_since=at - timedelta(hours=1), log_tail=["INFO engine started", "INFO serving"],
            engine=EngineSample(requests_running=12, requests_waiting=k % 3, kv_cache_usage_ratio=0.4,
                                ttft_p99_seconds=0.15 + k * 0.01, itl_p99_seconds=0.02, e2e_p99_seconds=3.0,
                                generation_tokens_per_second=900, requests_per_second=4, errors_per_second=0,
                                generation_tokens_total=1e6 + sequence * 9000),
            process=ProcessSample(pid=1000 + k, rss_bytes=(2 + k % 2) * GIB, cpu_percent=50,
                                  gpu_memory_bytes=60 * GIB),
            canary_ok=True, canary_ttft_seconds=0.1,
        ) for k in range(replicas)],
    )


def seed(api_url: str, nodes: int, replicas: int, reports: int = 2) -> float:
    """Every node's reports through the report endpoint, a few at a time; seconds it took."""
    started = time.monotonic()

    def send(i: int) -> None:
        with httpx.Client(base_url=api_url, timeout=120,
                          headers={"Authorization": f"Bearer {s.AGENT_TOKEN}"}) as client:
            for sequence in range(1, reports + 1):
                body = node_report(i, 8, replicas, sequence, datetime.now(UTC)).model_dump(mode="json")
                client.post(f"/v1/agents/node-{i:04d}/report", json=body).raise_for_status()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(send, range(nodes)))
    return time.monotonic() - started


def old_console(work: Path) -> list[str]:
    """The command that runs the one-page console of ``OLD_CONSOLE``: its modules in place of today's console
    package (anything else it imports is today's)."""
    tree = work / "old"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_CONSOLE, "controlplane/console"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    old = tree / "controlplane" / "console"
    # Pitstop is installed in development mode, whose import hook finds today's package before any path entry:
    # the old modules are put in its place before the old page runs.
    launcher = tree / "old_console.py"
    launcher.write_text("import runpy\n\nimport controlplane.console\n\n"
                        f"controlplane.console.__path__[:] = [{str(old)!r}]\n"
                        f"runpy.run_path({str(old / 'app.py')!r}, run_name='__main__')\n")
    return [sys.executable, "-m", "streamlit", "run", str(launcher), "--server.headless", "true",
            "--server.address", "127.0.0.1", "--server.port", "{port}", "--browser.gatherUsageStats", "false"]


def time_load(browser: Any, url: str, ready: str) -> float:
    """Seconds from navigation to ``ready`` holding, in a fresh browser context (a new console session)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        started = time.monotonic()
        page.goto(url)
        page.wait_for_function(ready, timeout=LOAD_TIMEOUT_MS, polling="raf")
        return time.monotonic() - started
    finally:
        context.close()


def api_times(stack: s.Stack) -> dict[str, float]:
    """Seconds each read the pages make takes on this fleet, alone (best of 3)."""
    # The Replicas page reads one page of the table view; the full list is what `pitstop replicas` reads.
    reads: dict[str, dict[str, Any]] = {
        "/v1/summary": {}, "/v1/alerts?state=firing": {"state": "firing", "limit": 500},
        "/v1/replicas?view=table": {"view": "table", "limit": 200}, "/v1/replicas": {}, "/v1/gpus": {},
        "/v1/nodes": {}, "/v1/events": {"limit": 50}, "/v1/actions": {"limit": 100}}
    out = {}
    headers = {"Authorization": f"Bearer {stack.person_token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=120) as client:
        for path, params in reads.items():
            best = float("inf")
            for _ in range(3):
                started = time.monotonic()
                client.get(path.split("?")[0], params=params).raise_for_status()
                best = min(best, time.monotonic() - started)
            out[path] = round(best, 3)
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    chromium = s.chromium_path()
    if chromium is None:
        raise SystemExit("no chromium to drive (apt-get install chromium)")
    with s.running(work / "stack") as stack:
        stack.server({"policies_enabled": False, "stale_after_seconds": 86400.0, "max_report_bytes": 4 * 2**20})
        print(f"seeding {args.nodes} nodes x {args.replicas} replicas ...", flush=True)
        seeded = seed(stack.api_url, args.nodes, args.replicas)
        print(f"  seeded in {seeded:.0f} s", flush=True)
        env = {"PITSTOP_CONSOLE_TOKEN": stack.person_token, "PITSTOP_CONSOLE_API_URL": stack.api_url,
               "PITSTOP_CONSOLE_REFRESH_SECONDS": "600"}
        new = stack.console(refresh=600, env=env)
        old = stack.console(env=env, argv=old_console(work))
        reads = api_times(stack)
        pages = {"new fleet": (f"{new}/", READY["fleet"]), "new replicas": (f"{new}/replicas", READY["replicas"]),
                 "old (one page)": (f"{old}/", READY["old"])}
        times: dict[str, list[float]] = {name: [] for name in pages}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                for url, ready in pages.values():  # one warm-up load each: the console imports a page on first use
                    time_load(browser, url, ready)
                for _ in range(args.runs):
                    for name, (url, ready) in pages.items():
                        time.sleep(BETWEEN_LOADS_S)
                        times[name].append(round(time_load(browser, url, ready), 2))
                        print(f"  {name}: {times[name][-1]:.2f} s", flush=True)
            finally:
                browser.close()
    medians = {name: round(statistics.median(t), 2) for name, t in times.items()}
    return {"nodes": args.nodes, "replicas_per_node": args.replicas, "replicas": args.nodes * args.replicas,
            "gpus": args.nodes * 8, "runs": args.runs, "seconds": times, "median_seconds": medians,
            "targets_seconds": TARGETS, "api_read_seconds": reads, "seed_seconds": round(seeded, 1),
            "old_console": OLD_CONSOLE}


def print_table(result: dict[str, Any]) -> None:
    m, old = result["median_seconds"], result["median_seconds"]["old (one page)"]
    print(f"\nconsole interactive on {result['nodes']} nodes x {result['replicas_per_node']} replicas "
          f"(median of {result['runs']}):")
    print(f"  {'page':28} {'today':>8} {'target':>8} {'old page':>9} {'old/today':>10}")
    for page, key in (("Fleet", "new fleet"), ("Replicas", "new replicas")):
        target = TARGETS[key.split()[1]]
        verdict = "ok" if m[key] < target else "MISSED"
        print(f"  {page:28} {m[key]:>7.2f}s {target:>7.1f}s {old:>8.2f}s {old / m[key]:>9.1f}x  {verdict}")
    print("  API reads (best of 3): " + ", ".join(f"{k} {v:.2f}s" for k, v in result["api_read_seconds"].items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--replicas", type=int, default=8, help="replicas per node")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "console_scale.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pitstop-console-scale-") as tmp:
        result = run(args, Path(tmp))
    print_table(result)
    write_json(args.out, "console_scale", result)
    print(f"wrote {shown_path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
