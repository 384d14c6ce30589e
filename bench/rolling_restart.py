"""Zero-drop rolling restart: three simulated replicas behind a real HAProxy, steady streaming load.

HAProxy health-checks the agent's ``/v1/replicas/<name>/ready`` per replica (inter 500 ms, fall 1, rise 2).
The rolling restart is an operator's: one ``restart`` action per replica through the control plane's API
(``POST /v1/replicas/{node}/{name}/actions``), the next one posted once the executor has reported the previous
one succeeded (READY at the new generation) and HAProxy has had ``--settle`` seconds to see it back. The control
plane's disruption budget is told as much (``rollout_settle_seconds``): with its default 5 s it would hold back
a restart posted 2 s after the previous one as leaving the model short of capacity.

Pitstop: the agent drains first (readiness off, ``drain_grace`` for HAProxy to notice, in-flight work
finishes, then SIGTERM with ``--shutdown-timeout``). Baseline, in the same run: the same restarts with drain
disabled (no grace, no drain wait, ``--shutdown-timeout 0``), as a restart that just stops the engine.
Counted: failed requests (HTTP errors, broken streams) during the load that spans the restarts (it runs on
until ``--min-requests`` have ended, however slow the host), and the fewest servers HAProxy counted UP (sampled
every 100 ms through its admin socket).

The load's short streams leave it to chance whether one is on the replica when its engine stops: on a busy host
the load generator is the bottleneck, and a restart can find nothing in flight. So each restart is posted
while a witness, one longer stream sent straight to that replica's engine, is under way (its first token
seen): the drain must let it finish, and a restart without drain cuts it, every time.

    python bench/rolling_restart.py [--quick] [--runs 3] [--out bench/results/rolling_restart.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.figures import fmt, host_note, median, table, write_json
from bench.harness.fleet import Fleet, Replica
from bench.harness.haproxy import (
    CHECK_FALL,
    CHECK_INTER_MS,
    CHECK_RISE,
    DRAIN_GRACE,
    GUARD_SETTLE,
    HAProxy,
    UpSampler,
)
from bench.harness.load import BackgroundLoad
from bench.harness.procs import Processes, wait_until
from enginesim.loadgen import LoadSpec, RequestResult, prompt_text, stream_one

NAMES = ("r0", "r1", "r2")
MODES: dict[str, dict[str, Any]] = {
    "pitstop (drain)": {"drain_grace": DRAIN_GRACE, "drain_timeout": 30, "shutdown_timeout": 10,
                        "stop_timeout": 15},
    "baseline (no drain)": {"drain_grace": 0, "drain_timeout": 0, "shutdown_timeout": 0, "stop_timeout": 15},
}
# About 3 s of tokens on an idle host. A restart without drain stopped the engine 30 to 47 tokens into a 400-token
# witness under four busy loops on two cores; the drain waits for the rest, well inside its 30 s.
WITNESS_TOKENS = 240
MODEL = "bench-model"


class Witness:
    """One stream straight to an engine, in a thread of its own, from before a restart is posted to its end."""

    def __init__(self, url: str, tokens: int = WITNESS_TOKENS) -> None:
        self.url, self.tokens = url, tokens
        self.result = RequestResult(ok=False)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def one() -> None:
            async with httpx.AsyncClient() as client:
                await stream_one(client, self.url, MODEL, prompt_text(0, 64), self.tokens, 30.0, self.result)

        asyncio.run(one())

    def start(self) -> Witness:
        """Send it, and return once its first token came: it is in flight on the engine."""
        self._thread.start()
        wait_until(lambda: self.result.tokens > 0 or self.result.finished, 30, what="the witness stream's first token",
                   interval=0.02)
        if self.result.finished and not self.result.ok:
            raise RuntimeError(f"the witness stream to {self.url} failed before the restart: {self.result.error}")
        return self

    def end(self, timeout: float = 60.0) -> dict[str, Any]:
        self._thread.join(timeout)
        r = self.result
        return {"ok": r.ok, "tokens": r.tokens, "error": r.error if r.finished else "still streaming"}


def one_run(tmp: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    replicas = [Replica(name, args=["--sim-startup-seconds", "1", "--max-num-seqs", "64"], gpu=i,
                        extra={**MODES[mode], "warmup": {"requests": 2, "settle_count": 0}})
                for i, name in enumerate(NAMES)]
    with Processes(tmp / "logs") as procs:
        # The disruption budget counts a restarted replica as capacity once HAProxy can have seen it back (rise x
        # inter) and half a second more; the next restart is posted only after --settle, which is longer.
        fleet = Fleet.start(tmp, procs, replicas, agent={"backoff": {"base": 1, "cap": 2}},
                            server={"rollout_settle_seconds": GUARD_SETTLE})
        fleet.wait_all_ready()
        proxy = HAProxy(tmp / "haproxy", procs, agent_port=int(fleet.agent.rsplit(":", 1)[1]),
                        engines={r.name: r.port for r in replicas})
        wait_until(lambda: proxy.servers_up() == len(NAMES), 30, what="HAProxy sees every replica UP")
        spec = LoadSpec(urls=[proxy.url], concurrency=args.concurrency, duration=0, prompt_tokens=64,
                        max_tokens=args.max_tokens, model=MODEL, request_timeout=30)
        with UpSampler(proxy) as ups:
            load = BackgroundLoad(spec).start()
            time.sleep(args.lead)
            started = time.time()
            outcomes, witnesses = [], []
            for replica in replicas:
                witness = Witness(f"http://127.0.0.1:{replica.port}").start()
                action = fleet.act(replica.name, "restart")
                outcomes.append(fleet.wait_action(action["id"], timeout=120)["state"])
                witnesses.append({"replica": replica.name, **witness.end()})
                time.sleep(args.settle)
            restart_s = time.time() - started
            time.sleep(args.lead)
            # A busy machine serves fewer requests a second: the load runs on until the run holds enough of them.
            wait_until(lambda: load.ended() >= args.min_requests, 300,
                       what=f"{args.min_requests} requests to end through HAProxy")
            summary = load.stop()
        during = [n for at, n in ups.samples if started <= at <= started + restart_s]
    total = summary["requests_ok"] + summary["requests_failed"]
    return {"mode": mode, "requests": total, "failed": summary["requests_failed"], "ok": summary["requests_ok"],
            "cut_off_at_end": summary["requests_cut_off"], "errors": summary["errors"],
            "min_up": min(during, default=None), "restart_seconds": round(restart_s, 1),
            "actions": outcomes, "tokens_per_s": summary["tokens_per_s"], "witnesses": witnesses,
            "witnesses_cut": sum(1 for w in witnesses if not w["ok"])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one run, shorter lead-in (about 2 minutes)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--lead", type=float, default=5.0, help="load before the first and after the last restart")
    p.add_argument("--min-requests", type=int, default=500,
                   help="the load runs on past the lead-out until this many requests have ended")
    p.add_argument("--settle", type=float, default=CHECK_RISE * CHECK_INTER_MS / 1000.0 + 1.0,
                   help="pause after a replica is READY before the next restart (HAProxy needs rise x inter)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rolling_restart.json")
    args = p.parse_args()
    if args.quick:
        args.runs, args.lead = 1, 3.0
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix="bench-rr-") as tmp:
                r = one_run(Path(tmp), mode, args)
            runs.append(r)
            print(f"run {i + 1} {mode}: {r['failed']} failed of {r['requests']}, fewest UP {r['min_up']}, "
                  f"restarts {r['restart_seconds']} s, actions {r['actions']}, errors {r['errors']}; "
                  f"witness streams cut {r['witnesses_cut']} of {len(r['witnesses'])}", flush=True)
    rows, medians = [], {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        m = {k: median([float(r[k]) for r in mine if r[k] is not None])
             for k in ("requests", "failed", "min_up", "restart_seconds")}
        m["worst_failed"] = max(r["failed"] for r in mine)
        m["worst_min_up"] = min((r["min_up"] for r in mine if r["min_up"] is not None), default=None)
        medians[mode] = m
        rows.append([mode, fmt(m["requests"], digits=0), fmt(m["failed"], digits=0), str(m["worst_failed"]),
                     fmt(m["min_up"], digits=0), str(m["worst_min_up"]), fmt(m["restart_seconds"], " s")])
    print(f"\nrolling restart of 3 replicas behind HAProxy, {args.concurrency} streams x {args.max_tokens} tokens, "
          f"medians of {args.runs} run(s); {host_note()}")
    print(table(["mode", "requests", "failed", "worst failed", "fewest UP", "worst fewest UP", "restart"], rows))
    write_json(args.out, "rolling_restart", {
        "settings": {"runs": args.runs, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                     "drain_grace_s": DRAIN_GRACE, "settle_s": args.settle, "guard_settle_s": GUARD_SETTLE,
                     "haproxy_check": f"inter {CHECK_INTER_MS}ms fall {CHECK_FALL} rise {CHECK_RISE}",
                     "modes": MODES},
        "medians": medians, "runs": runs})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
