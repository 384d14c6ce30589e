"""What group commit buys: the write of agent reports alone, in batches of 1, 4 and 16, per report.

The report writer (controlplane/fleet/writer.py) applies the reports that queued while it wrote the last batch
in one transaction (controlplane/fleet/ingest.py). This times exactly that transaction — sequence check, node
rows, GPU and replica rows replaced, samples and events appended, the answers read back — for 256 nodes'
reports (8 GPUs and 8 replicas each, as cp_reports.py sends), several rounds per batch size, on a fresh SQLite
file or a throw-away PostgreSQL. No HTTP, no parsing: the server's other costs are in cp_reports.py.

    python bench/report_batches.py --backend postgresql [--rounds 6] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cp_reports import node_report  # noqa: E402
from bench.harness.figures import shown_path  # noqa: E402
from controlplane.fleet.ingest import apply_reports, desired_states  # noqa: E402
from controlplane.store.db import make_engine, make_sessionmaker, migrate, session_scope  # noqa: E402

NODES = 256
BATCHES = (1, 4, 16)


@contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/bench.db"
        return
    from tests.controlplane import pg

    reason = pg.missing_reason()
    if reason is not None:
        raise SystemExit(f"no PostgreSQL: {reason}")
    with pg.postgres_server() as address, pg.fresh_database(address) as url:
        yield url


def one_run(backend: str, rounds: int) -> dict[str, float]:
    """Median milliseconds per report for each batch size (the reports are built before the clock starts)."""
    with database(backend) as url:
        engine = make_engine(url)
        migrate(engine)
        sessions = make_sessionmaker(engine)
        start = datetime.now(UTC)
        nodes = [f"node-{i:04d}" for i in range(NODES)]
        sequence = 1
        out: dict[str, float] = {}
        for size in BATCHES:
            per_report = []
            for _ in range(rounds):
                for first in range(0, NODES, size):
                    at = start + timedelta(seconds=5 * sequence)
                    reports = [node_report(n, 8, 8, sequence, at) for n in nodes[first:first + size]]
                    began = time.perf_counter()
                    with session_scope(sessions) as session:
                        fences: dict[str, Any] = {}
                        apply_reports(session=session, reports=reports, now=datetime.now(UTC), fences=fences)
                        desired_states(session=session, nodes=[r.node for r in reports], fences=fences)
                    per_report.append((time.perf_counter() - began) / size)
                sequence += 1
            out[f"batch_{size}_ms"] = round(statistics.median(per_report) * 1000, 2)
        engine.dispose()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="postgresql")
    p.add_argument("--rounds", type=int, default=6, help="reports per node and batch size")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path, default=None,
                   help="JSON document (default bench/results/report_batches.<backend>.json)")
    args = p.parse_args()
    runs = []
    for run in range(args.runs):
        result = one_run(args.backend, args.rounds)
        print(json.dumps({"run": run + 1, "backend": args.backend, **result}), flush=True)
        runs.append(result)
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    medians |= {f"batch_{size}_vs_1": round(medians[f"batch_{size}_ms"] / medians["batch_1_ms"], 2)
                for size in BATCHES[1:]}
    print(json.dumps({"median_of": len(runs), "backend": args.backend, **medians}), flush=True)
    out = args.out or ROOT / "bench" / "results" / f"report_batches.{args.backend}.json"
    out.write_text(json.dumps({"benchmark": "report_batches", "settings": vars(args) | {"out": shown_path(out)},
                               "runs": runs, "medians": medians}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
