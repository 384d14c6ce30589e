"""Fault to action: a stall, a TTFT SLO breach and a hot GPU in simulated replicas; Pitstop vs the stock pipeline.

One real agent supervises three simulated engines, each its own model on its own GPU:
``stalled`` wedges as vLLM does (``--fault-hang-after`` with ``--fault-hang-gauges zero``: /health stays 200,
no token moves, running and waiting read 0, requests are accepted and never answered) while client requests
wait on it; ``slow`` runs ``--max-num-seqs 4`` and gets 48 concurrent streams at a known moment (TTFT p99 well over
500 ms); ``hot``'s GPU heats past its slowdown threshold (``--fault-hot-gpu-after``). Fault times are exact:
the simulator's timed faults count from the moment it listens, which the benchmark watches to 50 ms.

Pitstop: the control plane's policy loop with the default policies, their ``for:`` cut to ``--policy-for``
seconds (``policy_for_seconds`` in the output); measured from the fault to the action record's
``created_at`` (the stall's restart; the TTFT breach's and the hot GPU's alert, since ``ttft-slo`` and
``thermal`` alert) and to the agent acting (the replica leaving READY; none for alerts). For the stall the agent
acts first and on its own: fault → readiness off (WEDGED, on the agent's default canary settings), fault →
the restart record, fault → READY again at a new generation.
Pitstop's own time past ``for:`` (``pitstop_overhead_s``): from the moment the control plane's stored samples
first met the policy's condition to the action record's ``created_at``. That moment is the first sample of
the unbroken run of samples that crossed the threshold (samples are filed under their report's ``sent_at``,
the earliest the control plane could know of them), plus ``for:``; for the stall, the first sample that read
the generation counter at its final value plus ``for:``, or the receipt of the report carrying the agent's
WEDGED verdict when that came later (the detector needs both; ``pitstop_due_by`` says which). What it counts:
the round waiting for its turn (report interval, debounce, policy interval, duty cap, the policy process's
wake-up), never the signal's own climb past its threshold (``pitstop_crossing_s``, fault to the first crossing
sample) nor the ``for:``.
Baseline, side by side in the same run: Prometheus scraping the same agent every 15 s with the repo's rules
unchanged (``alerts/pitstop-rules.yml``: EngineStalled ``for: 2m``, TTFTSLOBreach ``for: 1m``, GPUHot
``for: 2m`` / GPUThrottled ``for: 1m``), Alertmanager with ``group_wait: 30s``, a webhook receiver;
measured from the fault to the alert's delivery. ``--quick`` shortens the baseline too (labelled).

    python bench/fault_to_action.py [--quick] [--runs 3] [--fleet 1000] [--backend postgresql]
                                    [--out bench/results/fault_to_action.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cp_reports import database, policy_round_stats
from bench.harness.crossing import Due, stall_due, thermal_due, threshold_due
from bench.harness.figures import fmt, host_note, median, ratio, table, write_json
from bench.harness.fleet import Fleet, ListenWatch, Replica, wall
from bench.harness.load import BackgroundLoad
from bench.harness.policy_loop import StandInLoop, server_runs_policies
from bench.harness.procs import Processes, free_port, wait_until
from bench.harness.stock_alerting import (
    WebhookReceiver,
    rule_for,
    rules_copy,
    start_alertmanager,
    start_prometheus,
)
from controlplane.fleet.queries import list_events
from controlplane.policy.conditions import Condition, StallCondition, ThermalCondition, ThresholdCondition
from controlplane.policy.snapshot import FleetSnapshot
from controlplane.policy_files import DEFAULTS_DIR, load_directory
from controlplane.remediation.snapshot import build_snapshot
from controlplane.store.db import make_engine, make_sessionmaker, session_scope
from enginesim.loadgen import LoadSpec

HANG_AFTER = 20.0  # past start and warmup: a replica must be READY before it wedges
STALL_LOAD_LEAD = 5.0  # the stalled replicas' streams start this long before their hang at the latest
HOT_AFTER = 25.0
FAULTS = ("stall", "ttft", "hot")
# Which policy acts and which stock alerts count, per fault.
POLICY = {"stall": "stall", "ttft": "ttft-slo", "hot": "thermal"}
ALERTS = {"stall": ("EngineStalled",), "ttft": ("TTFTSLOBreach",), "hot": ("GPUHot", "GPUThrottled")}
REPLICA = {"stall": "stalled", "ttft": "slow", "hot": "hot"}
LABELS = {"stall": {"replica": "b-stalled"}, "ttft": {"model": "b-ttft"}, "hot": {"gpu": "7"}}
# A small batch for the surge: twice as many streams as slots queue at once, so TTFT climbs (a load problem:
# ttft-slo alerts; it does not govern --max-num-seqs).
TTFT_SEQS = 24
TTFT_STREAMS = 64
TTFT_RATE = 30.0  # requests per second; 24 slots of 128-token requests serve fewer


def policy_dir(dest: Path, for_seconds: float) -> Path:
    """The default policies, scoped to the "p-" replicas; the measured ones' ``for:`` cut to ``for_seconds``.

    The others keep their durations (thermal-sustained's 15-minute cordon would otherwise fence the whole
    node, the baseline's twins included)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(DEFAULTS_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        for policy in data if isinstance(data, list) else [data]:
            if policy["name"] in POLICY.values() and "for" in policy.get("condition", {}):
                policy["condition"]["for"] = f"{for_seconds:g}s"
            policy["scope"] = {"models": ["p-*"]}  # the "b-" twins are the baseline's
        (dest / path.name).write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


class Poller:
    """Watches the control plane's actions and the agent's replica states every 200 ms in a thread."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.actions: dict[int, dict[str, Any]] = {}
        self.left_ready: dict[str, float] = {}
        self.not_ready: dict[str, float] = {}  # first time seen not ready (whatever the reason)
        self.ready_again: dict[str, float] = {}  # first time READY at a generation above the first one seen
        self._generation: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = httpx.Client(timeout=5)
        while not self._stop.wait(0.2):
            try:
                for a in client.get(f"{self.fleet.cp}/v1/actions", params={"limit": "200"}).json():
                    self.actions.setdefault(a["id"], a)
                for r in client.get(f"{self.fleet.agent}/v1/replicas").json():
                    now, name = time.time(), r["name"]
                    first = self._generation.setdefault(name, r["generation"])
                    if r["state"] != "READY":
                        self.not_ready.setdefault(name, now)
                    if self.first_action(name) and r["state"] != "READY":
                        self.left_ready.setdefault(name, now)
                    if r["state"] == "READY" and r["generation"] > first:
                        self.ready_again.setdefault(name, now)
            except (httpx.HTTPError, ValueError):
                continue
        client.close()

    def first_action(self, replica: str, policy: str | None = None) -> dict[str, Any] | None:
        mine = [a for a in self.actions.values() if (a.get("replica") == replica or
                f"/{replica}" in " ".join(a.get("replicas", [])) or a.get("target", "").endswith(replica))
                and a.get("kind") != "alert" and (policy is None or a.get("policy") == policy)]
        return min(mine, key=lambda a: a["id"]) if mine else None

    def first_record(self, policy: str, target_contains: str) -> dict[str, Any] | None:
        mine = [a for a in self.actions.values() if a.get("policy") == policy and target_contains in a["target"]]
        return min(mine, key=lambda a: a["id"]) if mine else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def condition_due(fleet: Fleet, policies: Path, actions: dict[str, dict[str, Any] | None]) -> dict[str, Due | None]:
    """Per fault, when the stored samples first met the acting policy's condition (``bench.harness.crossing``),
    read from the control plane's database once it has stopped."""
    by_name = {p.name: p for p in load_directory(policies)}
    engine = make_engine(fleet.database_url)
    out: dict[str, Due | None] = {}
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            snapshot = build_snapshot(session=session, now=datetime.now(UTC), history=timedelta(minutes=30))
            wedged = [e.received_at for e in list_events(session=session, limit=500, replica="p-stalled")
                      if e.to_state == "WEDGED"]
        for fault, action in actions.items():
            out[fault] = None if action is None else _due(fault, action, snapshot, by_name[POLICY[fault]].condition,
                                                          min(wedged, default=None))
    finally:
        engine.dispose()
    return out


def _due(fault: str, action: dict[str, Any], snapshot: FleetSnapshot, cond: Condition,
         wedged_at: datetime | None) -> Due | None:
    at = datetime.fromisoformat(action["created_at"])
    subject = action["target"].partition(":")[2]
    if fault == "hot":
        assert isinstance(cond, ThermalCondition)
        gpu = next((g for g in snapshot.gpus if g.key == subject), None)
        return None if gpu is None else thermal_due(cond, gpu, at)
    replica = next((r for r in snapshot.replicas if r.key == subject), None)
    if replica is None:
        return None
    if fault == "ttft":
        assert isinstance(cond, ThresholdCondition)
        return threshold_due(cond, replica.history, at)
    assert isinstance(cond, StallCondition)
    return stall_due(cond.for_, replica.history, at, wedged_at)


def fault_fleet() -> tuple[list[Replica], dict[str, Replica]]:
    """The benchmark's eight simulated replicas (and by name): each fault on a "p-" replica and a "b-" twin."""
    sim = ["--sim-startup-seconds", "1"]
    # Each fault twice, at the same moments: a "p-" replica the policies cover and a "b-" twin they leave
    # alone, so the stock pipeline still sees the fault Pitstop has already fixed on the other one.
    replicas = []
    # The TTFT model has two replicas: the governor's canary may take one of them out (budget: one READY).
    for side, first_gpu in (("p", 0), ("b", 4)):
        replicas += [
            Replica(f"{side}-stalled", args=[*sim, "--fault-hang-after", f"{HANG_AFTER:g}", "--fault-hang-gauges",
                                             "zero"], gpu=first_gpu,
                    model=f"{side}-stall"),
            *(Replica(f"{side}-slow{i}", args=[*sim, "--max-num-seqs", str(TTFT_SEQS)], gpu=first_gpu + 1 + i,
                      model=f"{side}-ttft") for i in range(2)),
            Replica(f"{side}-hot", args=[*sim, "--fault-hot-gpu-after", f"{HOT_AFTER:g}"], gpu=first_gpu + 3,
                    model=f"{side}-hot"),
        ]
    common = {"warmup": {"requests": 2, "settle_count": 0}, "drain_timeout": 3, "stop_timeout": 5,
              "shutdown_timeout": 2}
    for r in replicas:
        r.extra = dict(common)
    by_name = {r.name: r for r in replicas}
    return replicas, by_name


@dataclass
class Faults:
    """The faults under way: when each began (per fault and twin side), and what the run must stop after."""

    at: dict[tuple[str, str], float]
    poller: Poller
    loop: StandInLoop | None
    loads: list[BackgroundLoad]
    stall_load_lead: dict[str, float]


def start_faults(fleet: Fleet, replicas: list[Replica], watch: ListenWatch, by_name: dict[str, Replica],
                 policies: Path) -> Faults:
    """Wait for every replica, then let the timed faults happen (the stalls and the hot GPUs count from each
    engine's first listen) and start the TTFT surge; the moments are exact to the watch's 50 ms."""
    # Each READY once, not all at the same moment: on a busy host the stalled pair may wedge (and leave
    # readiness for good, the unrestarted twin above all) before the last replica has warmed up.
    been_ready: set[str] = set()
    stall_loads: dict[str, BackgroundLoad] = {}
    load_at: dict[str, float] = {}

    def stall_load(side: str) -> None:
        """Requests that will wait on the wedged engine (and be lost with it: counted in the finding)."""
        if side not in stall_loads:
            stall_loads[side] = BackgroundLoad(LoadSpec(
                urls=[f"http://127.0.0.1:{by_name[f'{side}-stalled'].port}"], concurrency=4, duration=0,
                prompt_tokens=32, max_tokens=64, model=f"{side}-stall", request_timeout=600)).start()
            load_at[side] = time.time()

    def all_been_ready() -> bool:
        been_ready.update(r.name for r in replicas if r.name not in been_ready and fleet.ready(r.name))
        # A slow fleet start must not leave a wedged engine with nothing in flight: a stalled replica's
        # streams begin STALL_LOAD_LEAD seconds before its hang at the latest.
        for side in "pb":
            listened = watch.first.get(f"{side}-stalled")
            if (f"{side}-stalled" in been_ready and listened is not None
                    and time.time() > listened + HANG_AFTER - STALL_LOAD_LEAD):
                stall_load(side)
        return len(been_ready) == len(replicas)

    wait_until(all_been_ready, 90, what="every replica READY")
    wait_until(lambda: len(watch.first) == len(replicas), 10, what="every engine listening")
    fault_at = {("stall", side): watch.first[f"{side}-stalled"] + HANG_AFTER for side in "pb"}
    fault_at |= {("hot", side): watch.first[f"{side}-hot"] + HOT_AFTER for side in "pb"}
    poller = Poller(fleet)
    loop = None if server_runs_policies() else StandInLoop(fleet.database_url, policies).__enter__()
    for side in "pb":
        stall_load(side)
    loads = [stall_loads[side] for side in "pb"]
    wait_until(lambda: time.time() > max(fault_at[("stall", s)] for s in "pb"), 60, what="the stalls")
    # A surge: arrivals paced above what the replica serves, so the queue and TTFT grow without pause.
    loads += [BackgroundLoad(LoadSpec(
        urls=[f"http://127.0.0.1:{by_name[f'{side}-slow{i}'].port}" for i in range(2)],
        concurrency=2 * TTFT_STREAMS, rate=2 * TTFT_RATE, duration=0, prompt_tokens=256, max_tokens=128,
        model=f"{side}-ttft", request_timeout=120)) for side in "pb"]
    for load in loads[2:]:
        load.start()
    fault_at |= {("ttft", side): time.time() for side in "pb"}
    # How long before its hang each wedged engine's streams began: a negative lead leaves nothing to lose.
    lead = {side: fault_at[("stall", side)] - load_at[side] for side in "pb"}
    return Faults(fault_at, poller, loop, loads, lead)


def one_run(tmp: Path, args: argparse.Namespace, database_url: str) -> dict[str, Any]:
    replicas, by_name = fault_fleet()
    policies = policy_dir(tmp / "policies", args.policy_for)
    server = {"policy_dir": str(policies), "policy_interval_seconds": 1.0, "database_url": database_url}
    with Processes(tmp / "logs") as procs, WebhookReceiver() as hook:
        watch = ListenWatch({r.name: r.port for r in replicas})
        # The agent's canary settings are its defaults: the wedge must be seen on them.
        fleet = Fleet.start(tmp, procs, replicas, server=server, agent={"scrape_interval": 1.0})
        quick = args.quick
        am = start_alertmanager(tmp, procs, hook.url, group_wait="5s" if quick else "30s")
        rules = rules_copy(tmp / "rules.yml", for_seconds=10 if quick else None, interval="5s" if quick else None)
        start_prometheus(tmp, procs, targets=[fleet.agent], alertmanager=am, rules=rules, control_plane=fleet.cp,
                         scrape_interval="5s" if quick else "15s", evaluation_interval="5s" if quick else "15s")
        others = None
        if args.fleet > 1:
            # The rest of a large fleet (``--fleet``): synthetic nodes of 8 GPUs and 8 replicas each, reporting
            # every 5 s from before the faults to the end, so the rounds judge the measured node among them.
            from bench.cp_reports import _template
            from bench.harness.report_agents import Background

            # Their models are in the policies' scope ("p-"), so every round judges them all.
            templates = [_template(f"node-{i:04d}", 8, 8).replace('"model":"model-', '"model":"p-fleet-')
                         for i in range(args.fleet - 1)]
            others = Background(fleet.cp, templates, interval=5.0, token="bench-agent-token").start()
            time.sleep(10.0)  # every node has reported, and the rounds have read them once
        # The rounds while the faults run: on a large fleet, a fault waits for the next round and then its length.
        rounds_before, counted_from = policy_round_stats(fleet.cp), time.time()
        faults = start_faults(fleet, replicas, watch, by_name, policies)
        fault_at, poller, loop, loads = faults.at, faults.poller, faults.loop, faults.loads
        got: dict[str, dict[str, Any]] = {}
        deadline = time.time() + args.timeout

        def done() -> bool:
            for fault in FAULTS:
                if fault in got:
                    continue
                hits = [d for name in ALERTS[fault] if (d := hook.first(name, **LABELS[fault])) is not None]
                if hits:
                    got[fault] = {"alert": min(hits, key=lambda d: d.at).labels["alertname"],
                                  "at": min(d.at for d in hits)}
            return len(got) == len(FAULTS) or time.time() > deadline

        wait_until(done, args.timeout + 30, what="the stock alerts", interval=0.5)
        ended = time.time()
        rounds_after = policy_round_stats(fleet.cp)
        poller.stop()
        if loop is not None:
            loop.__exit__()
        for load in loads:
            load.stop()
        if others is not None:
            others.stop()
    recorded = {f: poller.first_record(POLICY[f], "bench-node/3" if f == "hot" else "" if f == "ttft"
                                       else f"p-{REPLICA[f]}") for f in FAULTS}
    due = condition_due(fleet, policies, recorded)
    count = int(rounds_after.get("count", 0) - rounds_before.get("count", 0))
    took = rounds_after.get("sum", 0.0) - rounds_before.get("sum", 0.0)
    out: dict[str, Any] = {"policy_rounds": {"count": count, "mean_s": took / count
                                             if count else None, "over_s": ended - counted_from},
                           "deliveries": sorted({d.labels.get("alertname", "") + " " + ",".join(
        f"{k}={d.labels[k]}" for k in ("replica", "gpu", "model") if k in d.labels) for d in hook.deliveries})}
    for fault in FAULTS:
        names = [f"p-{REPLICA[fault]}"] if fault != "ttft" else ["p-slow0", "p-slow1"]
        action = recorded[fault]
        met = due[fault]
        # An alert asks nothing of the agent (a restart seen on the TTFT replicas would be another policy's).
        acted = None if fault == "ttft" else min((poller.left_ready[n] for n in names if n in poller.left_ready),
                                                 default=None)
        base = got.get(fault)
        stall = fault == "stall"
        not_ready = poller.not_ready.get(names[0]) if stall else None
        again = poller.ready_again.get(names[0]) if stall else None
        finding = (action.get("evidence") or [{}])[0] if action and stall else {}
        out[fault] = {
            "pitstop_action_s": wall(action["created_at"]) - fault_at[(fault, "p")] if action else None,
            "pitstop_crossing_s": met.crossed_at.timestamp() - fault_at[(fault, "p")] if met else None,
            "pitstop_overhead_s": wall(action["created_at"]) - met.due_at.timestamp() if action and met else None,
            "pitstop_due_by": met.by if met else None,
            "pitstop_action": {k: action[k] for k in ("kind", "policy", "target", "state")} if action else None,
            "pitstop_agent_acted_s": acted - fault_at[(fault, "p")] if acted else None,
            "pitstop_ready_off_s": not_ready - fault_at[(fault, "p")] if not_ready else None,
            "pitstop_ready_again_s": again - fault_at[(fault, "p")] if again else None,
            "requests_lost": (finding.get("measured") or {}).get("requests_lost") if stall else None,
            "load_lead_s": faults.stall_load_lead["p"] if stall else None,
            "baseline_s": base["at"] - fault_at[(fault, "b")] if base else None,
            # Not delivered by the end of the run: the baseline took at least this long.
            "baseline_waited_s": None if base else ended - fault_at[(fault, "b")],
            "baseline_alert": base["alert"] if base else None,
        }
    return out


def summarize(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[list[str]]]:
    """Medians per fault and the table rows. An alert never delivered counts as the time waited for it, and
    makes the baseline's median (and the ratio) a lower bound, shown with ">=" and ``baseline_lower_bound``."""
    medians, rows = {}, []
    for fault in FAULTS:
        m: dict[str, Any] = {k: median([r[fault][k] for r in runs if r[fault][k] is not None])
                             for k in ("pitstop_action_s", "pitstop_crossing_s", "pitstop_overhead_s",
                                       "pitstop_agent_acted_s", "pitstop_ready_off_s",
                                       "pitstop_ready_again_s")}
        waited = [r[fault]["baseline_s"] if r[fault]["baseline_s"] is not None else r[fault].get("baseline_waited_s")
                  for r in runs]
        m["baseline_s"] = median(waited)
        m["baseline_lower_bound"] = any(r[fault]["baseline_s"] is None for r in runs)
        m["ratio"] = ratio(m["baseline_s"], m["pitstop_action_s"])
        medians[fault] = m
        bound = ">=" if m["baseline_lower_bound"] else ""
        rows.append([fault, fmt(m["pitstop_ready_off_s"], " s"), fmt(m["pitstop_action_s"], " s"),
                     fmt(m["pitstop_crossing_s"], " s"), fmt(m["pitstop_overhead_s"], " s"),
                     fmt(m["pitstop_ready_again_s"], " s"), fmt(m["pitstop_agent_acted_s"], " s"),
                     bound + fmt(m["baseline_s"], " s"), bound + fmt(m["ratio"], "x"),
                     "/".join(f"{a} for {rule_for(a)}" for a in ALERTS[fault])])
    return medians, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="one run; baseline shortened (scrape 5 s, for: 10 s, group_wait 5 s), labelled so")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--policy-for", type=float, default=5.0, help="seconds each policy condition must hold")
    p.add_argument("--timeout", type=float, default=300.0, help="longest wait for the stock alerts")
    p.add_argument("--fleet", type=int, default=1,
                   help="nodes in the fleet: the measured one, and synthetic nodes of 8 GPUs and 8 replicas")
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite",
                   help="the control plane's store (postgresql: a throw-away server of Debian's binaries)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fault_to_action.json")
    args = p.parse_args()
    if args.quick:
        args.runs, args.timeout = 1, 90.0
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-f2a-") as tmp, database(args.backend, free_port()) as url:
            r = one_run(Path(tmp), args, url)
        runs.append(r)
        print(f"run {i + 1}: delivered {r['deliveries']}")
        rounds = r["policy_rounds"]
        print(f"run {i + 1}: {rounds['count']} policy rounds in the {rounds['over_s']:.0f} s of the faults, "
              f"{fmt(rounds['mean_s'], ' s')} each")
        print(f"run {i + 1}: " + "; ".join(
            f"{f}: pitstop {fmt(r[f]['pitstop_action_s'], ' s')} (past for: {fmt(r[f]['pitstop_overhead_s'], ' s')},"
            f" agent {fmt(r[f]['pitstop_agent_acted_s'], ' s')}),"
            f" baseline {fmt(r[f]['baseline_s'], ' s')} {r[f]['baseline_alert'] or ''}" for f in FAULTS), flush=True)
    medians, rows = summarize(runs)
    baseline_note = ("SHORTENED baseline (scrape 5 s, rule for: 10 s, group_wait 5 s)" if args.quick
                     else "stock baseline (scrape 15 s, repo rules unchanged, group_wait 30 s)")
    loop = "control plane's policy job" if server_runs_policies() else "stand-in policy loop (bench/harness)"
    print(f"\nfault to action, medians of {args.runs} run(s); {loop}, policies with for: {args.policy_for:g} s; "
          f"store {args.backend}; "
          f"{baseline_note}; {host_note()}")
    print(table(["fault", "readiness off", "pitstop action", "first crossing", "past for:", "READY again",
                 "agent acted", "baseline webhook",
                 "baseline/pitstop", "stock rule"],
                rows))
    write_json(args.out, "fault_to_action", {
        "settings": {"runs": args.runs, "policy_for_seconds": args.policy_for, "baseline": baseline_note,
                     "fleet_nodes": args.fleet, "backend": args.backend,
                     "policy_loop": "control plane's job" if server_runs_policies() else "stand-in (bench.harness)",
                     "hang_after_s": HANG_AFTER, "hot_after_s": HOT_AFTER},
        "medians": medians, "runs": runs})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
