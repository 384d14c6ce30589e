"""Leak: a 20 MB/min host-RSS leak found and restarted before exhaustion; no false alarm on leak-free memory.

Three parts, each labelled in the output:

1. **Real processes** (``--real-minutes``, 4 by default): a real agent and control plane supervise two
   simulated engines, one leaking (``--fault-leak-rss-mb-per-min 20``: real, touched host memory) and one
   not. The process-tree RSS the agent reports is read back from the control plane's sample API.
2. **Detection replay** (pure, fast): the default ``rss-leak`` policy (``controlplane/policy/defaults``) with
   ``limit_bytes`` set so the leaking replica exhausts it 30 minutes after its start, evaluated every
   ``--eval-every`` seconds over a 45-minute series made of the real samples and, past them, the measured
   slope plus the real series' own residuals (resampled). Reported: when the policy first proposes its
   ``planned_restart`` and the time left to exhaustion at that moment (the restart must come before).
3. **False positives** (pure, fast): ``--days`` of leak-free memory per replica — the real steady replica's
   level plus jitter, allocator steps, a garbage-collection sawtooth and a daily swing — replayed through
   the same policy with the host's real memory as the limit; every proposed action is a false positive.

    python bench/leak.py [--quick] [--runs 3] [--out bench/results/leak.json]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.wire import ReplicaState
from bench.harness.figures import fmt, host_note, median, table, write_json
from bench.harness.fleet import NODE, Fleet, ListenWatch, Replica, wall
from bench.harness.policy_loop import server_runs_policies
from bench.harness.procs import Processes
from controlplane.policy.detectors.leak import theil_sen
from controlplane.policy.evaluate import evaluate
from controlplane.policy.policy import Policy
from controlplane.policy.snapshot import FleetSnapshot, Node, ReplicaSample
from controlplane.policy.snapshot import Replica as SnapReplica
from controlplane.policy_files import DEFAULTS_DIR, load_directory
from controlplane.remediation.planning import plan_restart, restart_deadline

MIB = 2**20
LEAK_MB_PER_MIN = 20.0
EXHAUSTION_MINUTES = 30.0
SERIES_MINUTES = 45.0
SAMPLE_EVERY = 5.0  # seconds between stored samples (the agent's default report interval)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rss_policy(limit_bytes: int | None) -> Policy:
    policy = next(p for p in load_directory() if p.name == "rss-leak")
    if limit_bytes is None:
        return policy
    cond = policy.condition.model_copy(update={"limit_bytes": limit_bytes})
    return policy.model_copy(update={"condition": cond})


# -- part 1: real processes ------------------------------------------------------------------------------
def acted_policy(dest: Path, limit_bytes: int, window_s: float) -> None:
    """rss-leak as shipped but for the "leak-acted" model, its limit given, its window cut (labelled so).

    The window is cut so the real-time part fits a benchmark run; the shipped 10-minute window is what the
    replay (part 2) measures."""
    data = yaml.safe_load((DEFAULTS_DIR / "rss-leak.yaml").read_text())
    data["scope"] = {"models": ["leak-acted"]}
    data["condition"].update({"limit_bytes": limit_bytes, "min_window": f"{window_s:g}s", "min_samples": 10})
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "rss-leak.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def record_real(tmp: Path, minutes: float, window_s: float) -> tuple[dict[str, list[tuple[float, float]]],
                                                                      dict[str, Any]]:
    """RSS series (seconds since the first sample, bytes) of a leaking and a steady replica, and, when the
    control plane runs its policy loop, what it did about a third, leaking replica in scope of rss-leak."""
    leak = ["--sim-startup-seconds", "1", "--fault-leak-rss-mb-per-min", f"{LEAK_MB_PER_MIN:g}"]
    replicas = [Replica("leaky", args=leak, gpu=0, model="leak-observed"),
                Replica("steady", args=["--sim-startup-seconds", "1"], gpu=1, model="leak-observed"),
                Replica("acted", args=leak, gpu=2, model="leak-acted"),
                # A peer, so the disruption budget (one replica READY) lets the leaking one restart.
                Replica("acted-peer", args=["--sim-startup-seconds", "1"], gpu=3, model="leak-acted")]
    policies = tmp / "policies"
    acted_policy(policies, 2**50, window_s)  # no limit in reach until the real one is known
    acted: dict[str, Any] = {"loop": server_runs_policies(), "window_s": window_s}
    with Processes(tmp / "logs") as procs:
        watch = ListenWatch({"acted": replicas[2].port})
        fleet = Fleet.start(tmp, procs, replicas, agent={"process_interval": SAMPLE_EVERY,
                                                         "report_interval": SAMPLE_EVERY},
                            server={"policy_dir": str(policies), "policy_interval_seconds": 2.0,
                                    "report_interval_seconds": SAMPLE_EVERY})
        fleet.wait_all_ready()
        listen = watch.first["acted"]
        rss = int(fleet.agent_replica("acted")["process"]["rss_bytes"])
        elapsed = time.time() - listen
        # Exhaustion 30 minutes after the leak began: what is left, at the injected rate, from now.
        limit = rss + int((EXHAUSTION_MINUTES * 60 - elapsed) / 60 * LEAK_MB_PER_MIN * 1e6)
        acted_policy(policies, limit, window_s)
        acted |= {"limit_bytes": limit, "exhaustion_after_s": EXHAUSTION_MINUTES * 60}
        end = time.time() + minutes * 60
        while time.time() < end:
            if "action_after_s" not in acted:
                found = [a for a in fleet.actions(policy="rss-leak") if a["kind"] != "alert"
                         and a["state"] != "suppressed"]
                if found:
                    first = min(found, key=lambda a: a["id"])
                    acted |= {"action_after_s": wall(first["created_at"]) - listen, "action": first["kind"],
                              "action_state": first["state"], "outcome": first["outcome"]}
            elif "restarted_after_s" not in acted and fleet.agent_replica("acted")["state"] != "READY":
                acted["restarted_after_s"] = time.time() - listen
            time.sleep(1.0)
        out: dict[str, list[tuple[float, float]]] = {}
        for r in replicas[:2]:
            rows = fleet.client.get(f"{fleet.cp}/v1/replicas/{NODE}/{r.name}/samples",
                                    params={"limit": "10000"}).json()
            points = [(wall(s["at"]), float(s["values"]["rss_bytes"])) for s in rows
                      if s["values"].get("rss_bytes")]
            start = points[0][0]
            out[r.name] = [(t - start, v) for t, v in points]
    return out, acted


# -- part 2: detection replay ----------------------------------------------------------------------------
def extend(real: list[tuple[float, float]], minutes: float, rng: random.Random) -> list[tuple[float, float]]:
    """The real samples, continued to ``minutes`` by their Theil-Sen trend plus their own residuals."""
    slope, intercept, _ = theil_sen(real)
    residuals = [v - (intercept + slope * t) for t, v in real]
    out = [(t, v) for t, v in real]
    t = real[-1][0]
    while t < minutes * 60:
        t += SAMPLE_EVERY
        out.append((t, intercept + slope * t + rng.choice(residuals)))
    return out


def snapshot(series: list[tuple[float, float]], upto: int, now: datetime, memory_total: int) -> FleetSnapshot:
    lookback_start = now - timedelta(hours=2)
    history = [ReplicaSample(at=T0 + timedelta(seconds=t), rss_bytes=int(v)) for t, v in series[:upto]
               if T0 + timedelta(seconds=t) >= lookback_start]
    replica = SnapReplica(node=NODE, name="r", model="bench-model", state=ReplicaState.READY, ready=True,
                          history=history)
    return FleetSnapshot(now=now, nodes=[Node(name=NODE, memory_total_bytes=memory_total)], replicas=[replica])


def first_action(policy: Policy, series: list[tuple[float, float]], every: float, memory_total: int,
                 stop_at_first: bool = True) -> tuple[list[tuple[float, dict[str, Any]]], int]:
    """(seconds, action summary) of every action proposed, evaluating every ``every`` series-seconds."""
    found: list[tuple[float, dict[str, Any]]] = []
    evaluations, i, t = 0, 0, every
    end = series[-1][0]
    while t <= end:
        while i < len(series) and series[i][0] <= t:
            i += 1
        now = T0 + timedelta(seconds=t)
        evaluations += 1
        for a in evaluate([policy], snapshot(series, i, now, memory_total), now):
            measured = a.findings[0].measured if a.findings else {}
            found.append((t, {"kind": a.kind, "params": a.params, "reason": a.reason,
                              "seconds_to_limit": measured.get("seconds_to_limit"),
                              "slope_mib_per_min": float(measured.get("slope_bytes_per_minute") or 0) / MIB}))
        if found and stop_at_first:
            break
        t += every
    return found, evaluations


def detection(real: list[tuple[float, float]], rng: random.Random, every: float) -> dict[str, Any]:
    series = extend(real, SERIES_MINUTES, rng)
    # Exhaustion 30 minutes after start, at the rate the leak really has on this host.
    slope, intercept, _ = theil_sen(real)
    limit = int(intercept + slope * EXHAUSTION_MINUTES * 60)
    found, _ = first_action(rss_policy(limit), series, every, memory_total=psutil.virtual_memory().total)
    if not found:
        return {"detected_after_s": None, "limit_bytes": limit, "slope_mib_per_min": slope * 60 / MIB}
    t, action = found[0]
    exhaustion = (limit - intercept) / slope
    # The control plane's planning: the restart is due within the policy's ``within`` or before the projected
    # limit (with its safety factor), and runs in the quietest forecast moment before that (no traffic
    # history here: at once).
    now = T0 + timedelta(seconds=t)
    within = float(action["params"].get("within_seconds", 3600))
    deadline = restart_deadline(now, within, action["seconds_to_limit"])
    planned, why = plan_restart(now, deadline, [])
    restart_by = (deadline - T0).total_seconds()
    return {"detected_after_s": t, "action": action, "limit_bytes": limit, "exhaustion_after_s": exhaustion,
            "restart_due_by_s": restart_by, "restart_planned_at_s": (planned - T0).total_seconds(),
            "plan": why, "margin_s": exhaustion - restart_by,
            "slope_mib_per_min": slope * 60 / MIB}


# -- part 3: false positives -----------------------------------------------------------------------------
def noisy_flat(level: float, days: float, rng: random.Random) -> list[tuple[float, float]]:
    """Leak-free memory: jitter, allocator steps that come and go, a GC sawtooth and a daily swing."""
    out, step, t = [], 0.0, 0.0
    saw_period = rng.uniform(240, 600)
    while t < days * 86400:
        if rng.random() < 1 / 720:  # about one allocator step an hour, up or down, 16-128 MiB
            step = rng.choice([-1, 1]) * rng.uniform(16, 128) * MIB if step == 0 else 0.0
        saw = (t % saw_period) / saw_period * 48 * MIB
        daily = 200 * MIB * math.sin(2 * math.pi * t / 86400)
        out.append((t, level + step + saw + daily + rng.gauss(0, 8 * MIB)))
        t += SAMPLE_EVERY
    return out


def false_positives(level: float, days: float, replicas: int, rng: random.Random) -> dict[str, Any]:
    policy = rss_policy(None)
    total = psutil.virtual_memory().total
    found, evaluations = 0, 0
    for _ in range(replicas):
        actions, n = first_action(policy, noisy_flat(level, days, rng), 300.0, total, stop_at_first=False)
        found += len(actions)
        evaluations += n
    return {"replica_days": days * replicas, "evaluations": evaluations, "false_positives": found}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1.5 real minutes (50 s window), one replay, one noisy day")
    p.add_argument("--runs", type=int, default=3, help="replays of the detection with different residual draws")
    p.add_argument("--real-minutes", type=float, default=4.0)
    p.add_argument("--real-window", type=float, default=120.0,
                   help="min_window (s) of the real-time policy loop part; the shipped policy says 10 min")
    p.add_argument("--eval-every", type=float, default=15.0, help="series seconds between policy evaluations")
    p.add_argument("--days", type=float, default=7.0, help="leak-free days per replica")
    p.add_argument("--replicas", type=int, default=4, help="leak-free replicas")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "leak.json")
    args = p.parse_args()
    if args.quick:
        args.runs, args.real_minutes, args.real_window, args.days, args.replicas = 1, 1.5, 50.0, 1.0, 1
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-leak-") as tmp:
        real, acted = record_real(Path(tmp), args.real_minutes, args.real_window)
    measured = theil_sen(real["leaky"])[0] * 60 / MIB
    steady = theil_sen(real["steady"])[0] * 60 / MIB
    print(f"real processes, {args.real_minutes:g} min: leaking replica grows {measured:.1f} MiB/min "
          f"({len(real['leaky'])} samples), steady one {steady:.2f} MiB/min", flush=True)
    if acted["loop"]:
        print(f"real policy loop (min_window cut to {acted['window_s']:g} s): {acted.get('action', 'no action')} "
              f"recorded after {fmt(acted.get('action_after_s'), ' s', 0)}, agent restarted the replica after "
              f"{fmt(acted.get('restarted_after_s'), ' s', 0)}; exhaustion at {acted['exhaustion_after_s']:g} s",
              flush=True)
    runs = [detection(real["leaky"], rng, args.eval_every) for _ in range(args.runs)]
    for r in runs:
        print(f"replay: planned restart proposed after {fmt(r['detected_after_s'], ' s', 0)}, "
              f"due by {fmt(r.get('restart_due_by_s'), ' s', 0)}, exhaustion at "
              f"{fmt(r.get('exhaustion_after_s'), ' s', 0)}", flush=True)
    level = median([v for _, v in real["steady"]]) or 0.0
    fp = false_positives(level, args.days, args.replicas, rng)
    detected = median([r["detected_after_s"] for r in runs])
    margin = median([r.get("margin_s") for r in runs])
    print(f"\nleak of {LEAK_MB_PER_MIN:g} MB/min, limit {EXHAUSTION_MINUTES:g} min away, default rss-leak policy, "
          f"medians of {args.runs} replay(s); {host_note()}")
    loop_row = (["real loop: planned restart recorded / agent restarted (window cut)",
                 f"{fmt(acted.get('action_after_s'), ' s', 0)} / {fmt(acted.get('restarted_after_s'), ' s', 0)}",
                 f"< {EXHAUSTION_MINUTES * 60:g} s (exhaustion)"] if acted["loop"] else
                ["real loop", "control plane has no policy job", "-"])
    print(table(["figure", "value", "target"], [loop_row,
        ["leak slope measured on real processes", f"{measured:.1f} MiB/min", f"{LEAK_MB_PER_MIN:g} MB/min injected"],
        ["planned restart proposed after (replay)", fmt(detected, " s", 0), "<= 600 s"],
        ["restart due before exhaustion by (replay)", fmt(margin, " s", 0), "> 0 s"],
        ["false positives, leak-free noisy replay", f"{fp['false_positives']} in {fp['replica_days']:g} replica-days "
         f"({fp['evaluations']} evaluations)", "0"],
    ]))
    write_json(args.out, "leak", {
        "settings": {"real_minutes": args.real_minutes, "eval_every_s": args.eval_every, "days": args.days,
                     "replicas": args.replicas, "seed": args.seed, "sample_every_s": SAMPLE_EVERY,
                     "parts": {"real": "real agent, control plane and simulated engines",
                               "detection": "pure replay: real samples then trend + real residuals",
                               "false_positives": "pure replay: synthetic noisy leak-free memory"}},
        "real": {"leak_mib_per_min": measured, "steady_mib_per_min": steady, "samples": len(real["leaky"])},
        "real_loop": acted,
        "medians": {"detected_after_s": detected, "margin_s": margin}, "detection_runs": runs,
        "false_positives": fp})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
