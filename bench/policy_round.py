"""A policy round at fleet scale, alone on the CPU: what one round costs, and what it costs when only part changed.

The store (SQLite) is seeded with ``--history-minutes`` of readings for ``--agents`` nodes of 8 GPUs and 8
replicas (``cp_reports.seed_history``: jittered as live readings are). Each run then starts a control plane's
``PolicyRounds`` in a process of its own, as the policy process holds it (the history cache, the latest rows, the
incremental evaluator, the heap freezer), runs the leader's cold round, and then ``--rounds`` rounds, each after
``--changed`` of the nodes reported once more through the report writer's transaction
(``fleet.ingest.apply_reports``, no HTTP). With ``--changed 1`` every node reported between two rounds (a round
spaced past the report interval, the case under load); with 0.2 a round came a second after the last.

Measured per round (medians over the rounds after the first, then over runs): the round's seconds and CPU seconds
(``PolicyRounds.run`` as the policy process calls it, the garbage collection after the round included; nothing
is proposed on a calm fleet, so the executor does no work; the CPU seconds are the steadier figure on a shared
machine), that collection alone, and how many subjects the evaluator judged, reused from an earlier round, or
screened, and how many subject-policy pairs it looked at (``walked``; the rest kept their answers unlooked).

``--baseline REV`` measures that revision of the repository too, side by side: the runs alternate between the
two trees, each on a fresh copy of the same seeded store. ``--scope GLOB`` judges with the default policies each
scoped to the models GLOB matches, as an operator scopes policies to theirs (``"*"``: every model, through the
scope's matching); without it, the default policies as shipped (scope everything).

The freezer is the policy process's own where the tree has one (a collection every 30 s, so the rounds measured
seldom hold one; ``gc_s`` is then 0), else a collection after every round.

    python bench/policy_round.py --baseline HEAD~3 --runs 3                 # 1,000 nodes, 15 minutes
    python bench/policy_round.py --changed 0.2 --runs 3
    python bench/policy_round.py --quick                                     # 50 nodes, 2 minutes, one run
    python bench/policy_round.py --scope '*' --changed 0.5 --baseline HEAD~3 --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INTERVAL = 5.0


def worker(args: argparse.Namespace) -> int:
    """One run, in the tree ``args.tree``: the rounds over a copy of the seeded store; prints one JSON line."""
    sys.path.insert(0, str(args.tree))
    import controlplane.heap
    from bench.cp_reports import node_report
    from controlplane.config import ServerConfig
    from controlplane.fleet.ingest import apply_reports
    from controlplane.heap import HeapFreezer
    from controlplane.rounds import PolicyRounds
    from controlplane.store.db import make_engine, make_sessionmaker, session_scope

    url = f"sqlite:///{args.db}"
    sessions = make_sessionmaker(make_engine(url))
    now = datetime.now(UTC)
    clock = [now]
    reports = [node_report(f"node-{i:04d}", 8, 8, 1, now) for i in range(args.agents)]
    every = max(1, round(1 / args.changed))
    sequence = int(time.time())

    def report(step: int) -> None:
        # The nodes whose turn it is (all of them with --changed 1), spread over the interval as agents are.
        due = [r.model_copy(update={"sequence": sequence + step,
                                    "sent_at": clock[0] - timedelta(seconds=INTERVAL / every * (1 - i / len(reports)))})
               for i, r in enumerate(reports) if i % every == step % every]
        for first in range(0, len(due), 64):
            with session_scope(sessions) as session:
                apply_reports(session=session, reports=due[first:first + 64], now=clock[0])

    class TimedFreezer(HeapFreezer):
        """The policy process's freezer, timing the collection it runs after each round."""

        collect_s = 0.0

        def during_round(self) -> Any:
            self.collect_s = 0.0  # a round whose end does not collect
            return super().during_round()

        def after_round(self) -> None:
            started = time.perf_counter()
            super().after_round()
            self.collect_s = time.perf_counter() - started

    scoped: dict[str, Any] = {}
    if args.scope is not None:
        from controlplane.policy_files import DEFAULTS_DIR

        # The default policies, each given the scope: a file of a default's name replaces it.
        policies = Path(args.db).with_name(Path(args.db).stem + "-policies")
        policies.mkdir()
        for default in sorted(Path(DEFAULTS_DIR).glob("*.yaml")):
            scope = f"\nscope: {{models: [{json.dumps(args.scope)}]}}\n"
            (policies / default.name).write_text(default.read_text() + scope)
        scoped = {"policy_dir": str(policies)}
    config = ServerConfig(database_url=url, policy_history_seconds=args.history_minutes * 60 + 60, **scoped)
    # The policy process's freezer (a tree from before it collected on a schedule: after every round).
    collect = getattr(controlplane.heap, "ROUNDS_ONLY_COLLECT_SECONDS", None)
    heap = TimedFreezer() if collect is None else TimedFreezer(collect_seconds=collect)
    rounds = PolicyRounds(sessions=sessions, config=config, clock=lambda: clock[0], monotonic=lambda: 1e12,
                          heap=heap)
    report(0)
    started = time.perf_counter()
    rounds.run()
    cold = time.perf_counter() - started
    measured: list[dict[str, float]] = []
    for step in range(1, args.rounds + 1):
        clock[0] += timedelta(seconds=INTERVAL / every)
        report(step)
        started, cpu = time.perf_counter(), time.process_time()
        rounds.run()
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        evaluator = rounds.evaluator
        measured.append({"round_s": took, "round_cpu_s": cpu, "gc_s": heap.collect_s,
                         "judged": evaluator.judged,
                         "reused": evaluator.reused, "screened": getattr(evaluator, "screened", 0),
                         # Pairs looked at; a build without the walk looked at every one.
                         "walked": getattr(evaluator, "walked", evaluator.judged + evaluator.reused
                                           + getattr(evaluator, "screened", 0))})
    steady = measured[1:] or measured  # the first round after the cold one still settles the cold one's answers
    print(json.dumps({"cold_s": cold, "rounds": measured,
                      **{k: statistics.median(m[k] for m in steady) for k in measured[0]}}), flush=True)
    return 0


def _tree(rev: str, into: Path) -> Path:
    """The repository at ``rev``, unpacked (the runs import it instead of this checkout)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--history-minutes", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds per run (after the cold one)")
    parser.add_argument("--changed", type=float, default=1.0, help="share of the nodes that report between rounds")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--baseline", help="a revision measured side by side (git archive of it)")
    parser.add_argument("--scope", help="the default policies scoped to the models this glob matches")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "policy_round.json")
    parser.add_argument("--quick", action="store_true", help="50 nodes, 2 minutes of history, 3 rounds, one run")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.history_minutes, args.rounds, args.runs = 50, 2.0, 3, 1
    if not 0 < args.changed <= 1:
        parser.error("--changed is a share of the nodes: over 0, at most 1")
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT))
    from bench.cp_reports import seed_history
    from bench.harness.figures import shown_path, write_json

    with tempfile.TemporaryDirectory(prefix="pitstop-bench-round-") as base:
        seeded_db = Path(base) / "seeded.db"
        started = time.perf_counter()
        seeded = seed_history(f"sqlite:///{seeded_db}", args.agents, 8, 8, INTERVAL, args.history_minutes)
        with sqlite3.connect(seeded_db) as conn:  # the whole store in the one file each run copies
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        print(f"seeded {seeded:,} samples in {time.perf_counter() - started:.0f} s", flush=True)
        trees = {"current": ROOT}
        if args.baseline:
            trees = {"baseline": _tree(args.baseline, Path(base) / "baseline"), **trees}
        runs: list[dict[str, Any]] = []
        for n in range(args.runs):
            for name, tree in trees.items():  # alternating, on the same machine
                db = Path(base) / f"{name}-{n}.db"  # a name of its own: no write-ahead log of an earlier run
                shutil.copyfile(seeded_db, db)
                proc = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--worker", "--tree", str(tree), "--db", str(db),
                     "--agents", str(args.agents), "--history-minutes", str(args.history_minutes),
                     "--rounds", str(args.rounds), "--changed", str(args.changed),
                     *(["--scope", args.scope] if args.scope is not None else [])],
                    cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
                for leftover in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
                    leftover.unlink(missing_ok=True)
                if proc.returncode != 0:
                    print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
                    return 1
                result = {"tree": name, "run": n + 1, **json.loads(proc.stdout.strip().splitlines()[-1])}
                runs.append(result)
                print(f"{name:>9} run {n + 1}: round {result['round_s']:.3f} s ({result['round_cpu_s']:.3f} s CPU), "
                      f"gc {result['gc_s']:.3f} s, judged {result['judged']:.0f}, reused {result['reused']:.0f}, "
                      f"screened {result['screened']:.0f}, walked {result['walked']:.0f}", flush=True)
    medians = {name: {k: statistics.median(r[k] for r in runs if r["tree"] == name)
                      for k in ("round_s", "round_cpu_s", "gc_s", "judged", "reused", "screened", "walked",
                                "cold_s")}
               for name in trees}
    ratio = None
    if args.baseline:
        ratio = {k: medians["current"][k] / medians["baseline"][k] for k in ("round_s", "round_cpu_s")}
        print(f"round: {medians['current']['round_s']:.3f} s against {medians['baseline']['round_s']:.3f} s "
              f"at {args.baseline} ({ratio['round_s']:.2f}x); its CPU: {medians['current']['round_cpu_s']:.3f} s "
              f"against {medians['baseline']['round_cpu_s']:.3f} s ({ratio['round_cpu_s']:.2f}x)")
    write_json(args.out, "policy_round", {
        "settings": {"agents": args.agents, "history_minutes": args.history_minutes, "rounds": args.rounds,
                     "changed": args.changed, "runs": args.runs, "baseline": args.baseline, "quick": args.quick,
                     "scope": args.scope},
        "runs": runs, "medians": medians, "ratio_current_to_baseline": ratio})
    print(f"wrote {shown_path(args.out)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
