"""Governor: from --max-num-seqs 256 missing the ITL SLO, how fast does the itl-slo governor meet it, at what cost?

1. **Sweep** (the simulator's timing model on its virtual clock, ``enginesim.virtual_load``: closed-loop
   streams, no host contention): loads (memory share, streams, prompt+output) x the shipped ``itl-slo``
   ladder (256 ... 16), each value's throughput, ITL p99, TTFT p99 and preemptions. A value meets the SLO as
   the policy reads it: ITL p99 per reading (one scrape window of the agent: its default five seconds, as in
   the real runs) over the threshold in fewer than ``min_share`` of the readings. The p99 over the whole run
   is shown too, but it is not what the policy reads: a prefill that stalls every running sequence once a
   cycle can leave it under the threshold while the readings it falls in breach. A load qualifies when 256
   misses and a lower static value meets it; it is governable when that value costs no more throughput than
   the policy's ``max_throughput_drop`` (the governor never goes further). The best such value is the
   governed run's throughput target. TTFT is shown too: lowering never fixes it (why ``ttft-slo`` alerts).
2. **Governed run** (real processes): ``pitstop server`` with its policy job and the shipped policies, one
   ``pitstop agent`` supervising two simulated replicas of one model at ``--max-num-seqs 256`` behind a real
   HAProxy that health-checks the agent's readiness (a restart drains as in production: readiness off, HAProxy
   sees it, the streams in flight end, then the SIGTERM), and the first governable load on each replica
   (``enginesim.loadgen`` closed-loop streams through HAProxy) for ``--governed-seconds``. Run twice
   (``--arms``): the governor's steps as restarts, and with the engines running the live-cap plug-in, as live
   caps. Reported: load start -> the SLO met on every replica (ITL p99 as the agent reports it, read every
   second; first, and for good), the value the fleet settled on, its throughput after the last restart (the
   engines' own token counters), the requests failed, and the share of requests whose user saw the SLO met
   (each request's own inter-token p99; a failed one is not): over the run, and over the episode, from the
   governor's first action to the SLO met for good (before it, both arms are the same untreated breach).
3. **Static run**, side by side on the same harness and load: both replicas at the sweep's best static value,
   no policies; its throughput is the reference for the ratio.

``--quick`` (CI): one load, a 30 s sweep, the governor's ``for:``, its threshold and the canary window cut
(labelled), short runs; the governed run ends once every replica is lowered and meets the SLO over a whole window
after its warm-up (``--until-settled``; 300 s at most), so a slow host takes longer rather than fails. The policy
job, the agent, both engines and the load generator share this host's cores.
The threshold is cut to 150 ms because the simulated profile's decode step with a full prefill chunk in it takes
190 to 240 ms: at the shipped 200 ms, whether the readings at 256 breach depended on how fast the host ran the
engines (on a fast one they sat at 187 to 196 ms and only the opening surge breached). At 150 ms they breach on
any host, and the rung that meets it (64 at about 24 ms) keeps a wide margin.

    python bench/governor.py [--quick] [--duration 60] [--governed-seconds 360] [--static-seconds 150]
                             [--policy-for S] [--policy-threshold S] [--canary-window S] [--until-settled]
                             [--out bench/results/governor.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.figures import fmt, host_note, table, write_json
from bench.harness.fleet import Fleet, Replica
from bench.harness.haproxy import DRAIN_GRACE, GUARD_SETTLE, HAProxy
from bench.harness.load import BackgroundLoad
from bench.harness.procs import Processes, wait_until
from bench.harness.replica_watch import (
    ReplicaWatch,
    Tick,
    breach_share,
    converged,
    final_values,
    last_breach,
    last_restart,
    slo_met,
    throughput,
    window_meets,
)
from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import ThresholdCondition
from controlplane.policy_files import DEFAULTS_DIR, load_directory
from enginesim.loadgen import LoadSpec, percentile
from enginesim.profiles import H100_LLAMA_8B
from enginesim.virtual_load import run_virtual_load

Load = tuple[float, int, int, int]  # (gpu memory share, concurrent streams per replica, prompt, output tokens)
LOADS: list[Load] = [(0.9, 128, 512, 256), (0.9, 256, 512, 256), (0.9, 384, 256, 128), (0.5, 128, 512, 1024),
                     (0.45, 160, 256, 768), (0.4, 96, 512, 512), (0.4, 64, 1024, 256),
                     (0.9, 128, 256, 256)]
# The quick load: at 256 about half the readings breach (the closed-loop cohort finishes together and its next
# prompts fill whole prefill steps); 64 and 48 both meet the SLO with every reading under 40 ms, at 81 % and
# 72 % of 256's throughput (inside max_throughput_drop). The running batch is about 125, so the proportional
# step predicts 125 x 0.2 x 0.7 / (0.23 to 0.3) = 58 to 76: rung 48 or 64, one canary and one promotion.
QUICK_LOADS: list[Load] = [(0.9, 128, 256, 256)]
REPLICAS = ("gov-a", "gov-b")
MODEL = "gov-model"
WARMUP_S = 20.0  # a fresh engine's first steps are slower and its empty batch refills at once: not measured
SWEEP_SETTLE_S = 10.0  # the sweep's opening surge (every stream prefilling at once) is not judged
# The agent's scrape interval in the real runs: its default. Each ITL p99 reading covers one scrape window, and
# the sweep reads the virtual runs in windows as long.
SCRAPE_S = 5.0


def shipped_governor() -> tuple[ThresholdCondition, LowerMaxNumSeqsAction, float]:
    """The shipped ``itl-slo`` governor's condition and action, and ``ttft-slo``'s TTFT threshold."""
    policies = {p.name: p for p in load_directory()}
    itl, ttft = policies["itl-slo"], policies["ttft-slo"]
    assert isinstance(itl.condition, ThresholdCondition) and isinstance(itl.action, LowerMaxNumSeqsAction)
    assert isinstance(ttft.condition, ThresholdCondition)
    return itl.condition, itl.action, ttft.condition.threshold


def sweep_settle(duration: float) -> float:
    """Seconds at the start of a sweep run that are not judged (a third of a short run)."""
    return min(SWEEP_SETTLE_S, duration / 3)


def sweep(load: Load, ladder: list[int], cond: ThresholdCondition, max_drop: float | None, ttft_slo: float,
          duration: float) -> dict[str, Any]:
    """Each rung under ``load`` on the virtual clock, judged as the policy judges: the share of the agent's
    per-scrape ITL p99 readings over the threshold (after the opening surge), against ``min_share``."""
    util, streams, prompt, output = load
    slo, share = cond.threshold, cond.min_share
    rows = []
    for seqs in ladder:
        r = run_virtual_load(H100_LLAMA_8B, max_num_seqs=seqs, concurrency=streams, prompt_tokens=prompt,
                             output_tokens=output, duration=duration, gpu_memory_utilization=util,
                             reading_seconds=SCRAPE_S)
        breach = r.itl_breach_share(slo, since=sweep_settle(duration))
        rows.append({"max_num_seqs": seqs, "tokens_per_s": r.tokens_per_s, "ttft_p99_s": r.ttft_p99,
                     "itl_p99_s": r.itl_p99, "itl_breach_share": breach, "preemptions": r.preemptions,
                     "meets_slo": breach < share, "meets_ttft_slo": r.ttft_p99 <= ttft_slo})
    top = next(r for r in rows if r["max_num_seqs"] == max(ladder))
    best = max((r for r in rows if r["meets_slo"]), key=lambda r: r["tokens_per_s"], default=None)
    best_vs_top = best["tokens_per_s"] / top["tokens_per_s"] if best else None
    qualifies = (not top["meets_slo"]) and best is not None
    return {"gpu_memory_utilization": util, "streams": streams, "prompt_tokens": prompt, "output_tokens": output,
            "rows": rows, "top_misses_slo": not top["meets_slo"],
            "best_static": best["max_num_seqs"] if best else None,
            "best_static_tokens_per_s": best["tokens_per_s"] if best else None,
            "best_vs_top": best_vs_top, "qualifies": qualifies,
            # The governor may only get there when it costs no more throughput than its max_throughput_drop.
            "governable": qualifies and (max_drop is None or (best_vs_top or 0.0) >= 1 - max_drop),
            "ttft_fixed_by_lowering": top["ttft_p99_s"] > ttft_slo and any(r["meets_ttft_slo"] for r in rows)}


def policy_dir(dest: Path, for_seconds: float | None, threshold: float | None = None) -> Path | None:
    """The shipped itl-slo with its ``for:`` and threshold cut (it replaces the default by name); None to ship it
    as is."""
    if for_seconds is None and threshold is None:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((DEFAULTS_DIR / "itl-slo.yaml").read_text())
    if for_seconds is not None:
        data["condition"]["for"] = f"{for_seconds:g}s"
    if threshold is not None:
        data["condition"]["threshold"] = threshold
    (dest / "itl-slo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


# How each replica drains before a restart, behind HAProxy: what the rolling-restart benchmark measured to drop
# no request (readiness off, HAProxy's checks see it, in-flight streams end, then the SIGTERM).
DRAIN = {"drain_grace": DRAIN_GRACE, "drain_timeout": 30, "shutdown_timeout": 10, "stop_timeout": 15}


def fleet_run(tmp: Path, load: Load, value: int, seconds: float, server: dict[str, Any],
              until: Callable[[list[Tick]], bool] | None = None, live: bool = False,
              slo: float | None = None) -> dict[str, Any]:
    """Two replicas at ``value`` behind a real HAProxy under ``load`` for ``seconds`` (or until the readings so
    far meet ``until``, read every second: ``seconds`` is then the most it runs); every agent reading, the
    actions, the load, and each request's span and whether its user saw the SLO met."""
    util, streams, prompt, output = load
    sim = ["--sim-startup-seconds", "1", "--gpu-memory-utilization", f"{util:g}", "--max-num-seqs", str(value)]
    replicas = [Replica(name, args=sim, gpu=i, model=MODEL) for i, name in enumerate(REPLICAS)]
    for r in replicas:
        r.extra = {"warmup": {"requests": 2, "settle_count": 0}, **DRAIN, "live_limits": live}
    with Processes(tmp / "logs") as procs:
        fleet = Fleet.start(tmp, procs, replicas, server={"rollout_settle_seconds": GUARD_SETTLE, **server},
                            agent={"scrape_interval": SCRAPE_S, "canary_every": 1, "canary_timeout": 10})
        fleet.wait_all_ready()
        proxy = HAProxy(tmp / "haproxy", procs, agent_port=int(fleet.agent.rsplit(":", 1)[1]),
                        engines={r.name: r.port for r in replicas})
        wait_until(lambda: proxy.servers_up() == len(REPLICAS), 30, what="HAProxy sees every replica UP")
        watch = ReplicaWatch(fleet.agent, list(REPLICAS)).start()
        wall0 = time.time()
        spec = LoadSpec(urls=[proxy.url], concurrency=streams * len(replicas), duration=0, prompt_tokens=prompt,
                        max_tokens=output, model=MODEL, request_timeout=120)
        with BackgroundLoad(spec) as background:
            end = time.monotonic() + seconds
            while time.monotonic() < end and not (until is not None and until(list(watch.ticks))):
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            summary = background.stop()
            results = list(background.results)
        ticks = watch.stop()
        actions = [{k: a.get(k) for k in ("id", "policy", "kind", "target", "state", "created_at", "outcome")}
                   | {"max_num_seqs": a["params"].get("max_num_seqs", a["params"].get("live_cap"))}
                   for a in fleet.actions()]
    served = [r for r in results if r.finished and r.ok and r.itls]
    # Each served request judged by its own inter-token p99 against the SLO: what its user saw. A failed or
    # cut-off one is not within.
    met = {id(r): slo is not None and (percentile(r.itls, 99) or 0.0) <= slo for r in served}
    within = None if slo is None or not served else sum(met.values()) / len(served)
    # Every request sent, as (sent, ended or None, within the SLO), in seconds on the watch's clock.
    spans = [(round(r.started - watch.started, 2), None if r.ended is None else round(r.ended - watch.started, 2),
              met.get(id(r), False)) for r in results if r.started is not None]
    for a in actions:
        a["at_s"] = round(datetime.fromisoformat(str(a["created_at"])).timestamp() - wall0, 1)
    series = [[round(t.t, 1), {n: [r.state[:1], r.max_num_seqs, None if r.itl_p99_s is None else round(r.itl_p99_s, 4)]
                               for n, r in t.replicas.items()}] for t in ticks]
    return {"ticks": ticks, "series": series, "actions": sorted(actions, key=lambda a: a["id"]), "spans": spans,
            "load": {k: summary.get(k) for k in ("requests_ok", "requests_failed", "requests_cut_off")}
            | {"requests_within_slo_share": within}}


Span = tuple[float, float | None, bool]  # a request: sent, ended (None: cut off at the end), within the SLO


def episode(spans: list[Span], start: float | None, end: float | None) -> dict[str, Any]:
    """The requests in flight at any moment from ``start`` to ``end`` (sent before its end, not ended before its
    start) and the share whose user saw the SLO met (each request's own inter-token p99)."""
    if start is None or end is None or end < start:
        return {"from_s": start, "to_s": end, "requests": 0, "within_slo_share": None}
    touched = [within for sent, ended, within in spans if sent <= end and (ended is None or ended >= start)]
    return {"from_s": start, "to_s": end, "requests": len(touched),
            "within_slo_share": sum(touched) / len(touched) if touched else None}


def sent_since(spans: list[Span], since: float | None) -> dict[str, Any]:
    """The requests sent from ``since`` on that ended, and the share whose user saw the SLO met."""
    if since is None:
        return {"from_s": None, "requests": 0, "within_slo_share": None}
    ended = [within for sent, end, within in spans if sent >= since and end is not None]
    return {"from_s": since, "requests": len(ended),
            "within_slo_share": sum(ended) / len(ended) if ended else None}


def governed(tmp: Path, load: Load, args: argparse.Namespace, cond: ThresholdCondition,
             live: bool = False) -> dict[str, Any]:
    """The governed run: the governor's steps as restarts, or with ``live`` as live caps (the engines run the
    live-cap plug-in)."""
    server: dict[str, Any] = {"policy_interval_seconds": 1.0}
    if args.canary_window is not None:
        server["canary_window_seconds"] = args.canary_window
    if (cut := policy_dir(tmp / "policies", args.policy_for, args.policy_threshold)) is not None:
        server["policy_dir"] = str(cut)
    names = list(REPLICAS)
    window = args.policy_for or cond.for_  # the SLO is read over the policy's own (possibly cut) for:

    def settled(ticks: list[Tick]) -> bool:
        """Every replica lowered and READY, and the SLO met over a whole window after the last restart and its
        warm-up: the outcome is in, however long the host took to get there."""
        if not ticks or any(v is None or v >= 256 for v in final_values(ticks, names).values()):
            return False
        since = last_restart(ticks, names) + WARMUP_S
        return (ticks[-1].t - since >= window
                and window_meets(ticks, len(ticks) - 1, names, cond.threshold, window, cond.min_share))

    run = fleet_run(tmp, load, 256, args.governed_seconds, server, until=settled if args.until_settled else None,
                    live=live, slo=cond.threshold)
    ticks = run.pop("ticks")
    first, for_good = slo_met(ticks, names, cond.threshold, window, cond.min_share)
    # The governor's first action (before it, both arms are the same untreated breach: the policy's for:), the
    # moment every replica ran its final value, and the last reading over the SLO.
    acted = min((a["at_s"] for a in run["actions"] if a["policy"] == "itl-slo"), default=None)
    done = converged(ticks, names)
    spans = run.pop("spans")
    run |= {"acted_s": acted, "converged_s": done, "last_breach_s": last_breach(ticks, names, cond.threshold),
            # Every request in flight from the first action to the SLO met for good, those sent after the first
            # action, and those sent once every replica ran its final value.
            "episode": episode(spans, acted, for_good), "sent_after_action": sent_since(spans, acted),
            "sent_after_converged": sent_since(spans, done)}
    # Settled: from the last restart plus the warm-up the static run skips too, or the start of the window in
    # which the SLO was first met for good, whichever is later.
    settled_from = max(last_restart(ticks, names) + WARMUP_S, (for_good or 0.0) - window)
    end = ticks[-1].t if ticks else 0.0
    return {"live": live, "seconds": args.governed_seconds, "until_settled": args.until_settled,
            "ran_s": ticks[-1].t if ticks else 0.0, "slo_window_s": window, "slo_first_met_s": first,
            "slo_met_s": for_good,
            "settled_values": final_values(ticks, names), "settled_from_s": settled_from,
            "settled_span_s": end - settled_from,
            "throughput_settled": throughput(ticks, names, settled_from),
            "breach_share_settled": breach_share(ticks, names, cond.threshold, settled_from),
            "throughput_at_256": throughput([t for t in ticks if t.t <= 60], names, 15.0),
            **run}


def static(tmp: Path, load: Load, value: int, seconds: float, cond: ThresholdCondition) -> dict[str, Any]:
    run = fleet_run(tmp, load, value, seconds, {"policy_defaults": False, "policy_interval_seconds": 1.0},
                    slo=cond.threshold)
    ticks = run.pop("ticks")
    run.pop("spans")
    warm = min(WARMUP_S, seconds / 3)
    _, for_good = slo_met(ticks, list(REPLICAS), cond.threshold, min(cond.for_, seconds - warm), cond.min_share)
    return {"value": value, "seconds": seconds, "measured_from_s": warm,
            "throughput": throughput(ticks, list(REPLICAS), warm), "slo_met_s": for_good,
            "breach_share": breach_share(ticks, list(REPLICAS), cond.threshold, warm), **run}


def print_sweep(res: dict[str, Any], slo: float, ttft_slo: float, duration: float) -> None:
    print(f"\n--gpu-memory-utilization {res['gpu_memory_utilization']}, {res['streams']} streams x "
          f"{res['prompt_tokens']}+{res['output_tokens']} tokens, {duration:g} s virtual clock")
    print(table(["max_num_seqs", "tokens/s", "ITL p99 (run)", "readings > SLO", "TTFT p99", "preempt",
                 f"ITL<={slo:g}s", f"TTFT<={ttft_slo:g}s"],
                [[str(r["max_num_seqs"]), f"{r['tokens_per_s']:.0f}", fmt(r["itl_p99_s"] * 1000, " ms"),
                  f"{r['itl_breach_share']:.0%}", fmt(r["ttft_p99_s"], " s", 2), str(r["preemptions"]),
                  "yes" if r["meets_slo"] else "no", "yes" if r["meets_ttft_slo"] else "no"] for r in res["rows"]]))
    verdict = ("256 meets the ITL SLO: nothing to govern" if not res["top_misses_slo"] else
               f"256 misses; best static that meets it: {res['best_static']} ({res['best_static_tokens_per_s']:.0f} "
               f"tokens/s, {res['best_vs_top']:.0%} of 256's)" if res["qualifies"] else
               "256 misses and no lower value meets it")
    if res["qualifies"] and not res["governable"]:
        verdict += ": more throughput than the governor's max_throughput_drop gives up"
    print(f"verdict: {verdict}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one load, short runs, for: and canary window cut")
    p.add_argument("--duration", type=float, default=60.0, help="virtual seconds per sweep point")
    p.add_argument("--governed-seconds", type=float, default=360.0)
    p.add_argument("--static-seconds", type=float, default=150.0)
    p.add_argument("--policy-for", type=float, default=None, help="cut itl-slo's for: to this many seconds")
    p.add_argument("--policy-threshold", type=float, default=None,
                   help="cut itl-slo's ITL p99 threshold (the SLO, seconds) to this, in the sweep and the runs")
    p.add_argument("--canary-window", type=float, default=None, help="the server's canary_window_seconds")
    p.add_argument("--until-settled", action="store_true",
                   help="end the governed run once the outcome is in (--governed-seconds is then the most it runs)")
    p.add_argument("--arms", type=lambda v: [a for a in v.split(",") if a], default=["restarts", "live"],
                   help="the governed runs, comma-separated: restarts (every step a restart), live (the engines run "
                        "the live-cap plug-in: steps within the startup limit are live caps)")
    p.add_argument("--no-real", action="store_true", help="the sweep only")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "governor.json")
    args = p.parse_args()
    if not args.arms or any(a not in ("restarts", "live") for a in args.arms):
        p.error(f"--arms takes restarts and/or live, not {','.join(args.arms) or 'nothing'}")
    loads, duration = (QUICK_LOADS, 30.0) if args.quick else (LOADS, args.duration)
    if args.quick:
        # Until the outcome is in, however slow the host: a fixed 150 s was ~120 s of work plus slack, and a
        # busy host's slower restarts ended it before the second replica had met the SLO for a window.
        args.governed_seconds, args.static_seconds, args.until_settled = 300.0, 45.0, True
        args.policy_for = 30.0 if args.policy_for is None else args.policy_for
        args.canary_window = 40.0 if args.canary_window is None else args.canary_window
        args.policy_threshold = 0.15 if args.policy_threshold is None else args.policy_threshold
    cond, action, ttft_slo = shipped_governor()
    if args.policy_threshold is not None:
        cond = cond.model_copy(update={"threshold": args.policy_threshold})
    slo, ladder = cond.threshold, sorted(set(action.ladder or [256]), reverse=True)
    started = time.monotonic()
    results = [sweep(load, ladder, cond, action.max_throughput_drop, ttft_slo, duration) for load in loads]
    for res in results:
        print_sweep(res, slo, ttft_slo, duration)
    qualifying = [r for r in results if r["qualifies"]]
    governable = [r for r in qualifying if r["governable"]]
    print(f"\n{len(qualifying)} of {len(results)} loads qualify (256 misses ITL p99 <= {slo:g} s in "
          f"{cond.min_share:.0%} or more of the readings, a lower static value meets it), {len(governable)} within "
          f"the governor's throughput limit; {sum(r['ttft_fixed_by_lowering'] for r in results)} where lowering "
          f"fixes a TTFT breach; sweep took {time.monotonic() - started:.0f} s", flush=True)
    doc: dict[str, Any] = {
        "settings": {"slo_itl_p99_s": slo, "slo_min_share": cond.min_share, "reading_s": SCRAPE_S,
                     "sweep_settle_s": sweep_settle(duration), "slo_ttft_p99_s": ttft_slo, "ladder": ladder,
                     "duration_virtual_s": duration, "profile": H100_LLAMA_8B.name, "quick": args.quick,
                     "policy_for_s": args.policy_for or "shipped",
                     "policy_threshold_s": args.policy_threshold or "shipped",
                     "canary_window_s": args.canary_window or "server default",
                     "governed_seconds": args.governed_seconds, "until_settled": args.until_settled,
                     "arms": args.arms,
                     "static_seconds": args.static_seconds},
        "qualifying_loads": len(qualifying), "governable_loads": len(governable), "loads": results}
    if governable and not args.no_real:
        chosen = governable[0]
        load: Load = (chosen["gpu_memory_utilization"], chosen["streams"], chosen["prompt_tokens"],
                      chosen["output_tokens"])
        cut = (f"itl-slo for: {args.policy_for:g} s (CUT)" if args.policy_for is not None else "itl-slo as shipped")
        cut += f", threshold {args.policy_threshold:g} s (CUT)" if args.policy_threshold is not None else ""
        cut += f", canary window {args.canary_window:g} s (CUT)" if args.canary_window is not None else ""
        length = (f"until settled, {args.governed_seconds:g} s at most" if args.until_settled
                  else f"{args.governed_seconds:g} s")
        print(f"\ngoverned runs: 2 replicas at 256, load {load} per replica, {length}; {cut}", flush=True)
        arms: dict[str, dict[str, Any]] = {}
        for arm in args.arms:
            print(f"governed run, steps as {'live caps' if arm == 'live' else 'restarts'}", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"bench-gov-{arm}-") as tmp:
                arms[arm] = governed(Path(tmp), load, args, cond, live=arm == "live")
        gov = arms.get("restarts") or arms["live"]
        best = int(chosen["best_static"])
        print(f"static run: 2 replicas at {best}, same load, {args.static_seconds:g} s", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-static-") as tmp:
            ref = static(Path(tmp), load, best, args.static_seconds, cond)
        def vs_static(run: dict[str, Any]) -> float | None:
            return (run["throughput_settled"] / ref["throughput"]
                    if run["throughput_settled"] and ref["throughput"] else None)

        ratio = vs_static(gov)
        doc["real"] = {"load": load, "policies": cut, "governed": gov, "static": ref, "throughput_ratio": ratio}
        if "live" in arms:
            doc["real"]["governed_live"] = arms["live"]
            doc["real"]["throughput_ratio_live"] = vs_static(arms["live"])
        rows = []
        for arm, run in arms.items():
            for a in run["actions"]:
                print(f"  {arm} action {a['id']}: {a['policy']} {a['kind']} {a['target']} -> {a['max_num_seqs']} "
                      f"[{a['state']}] {a['outcome'] or ''}")
            shares = [run["load"]["requests_within_slo_share"], run["episode"]["within_slo_share"],
                      run["sent_after_action"]["within_slo_share"]]
            rows.append([f"governed, {arm}", fmt(run["slo_met_s"], " s"), fmt(run["last_breach_s"], " s"),
                         fmt(run["acted_s"], " s"), fmt(run["converged_s"], " s"), str(run["settled_values"]),
                         fmt(run["throughput_settled"], "", 0),
                         *[fmt(None if v is None else v * 100, " %") for v in shares],
                         str(run["load"]["requests_failed"]), fmt((r := vs_static(run)) and r * 100, " %", 0)])
        share = ref["load"]["requests_within_slo_share"]
        rows.append([f"static {best}", fmt(ref["slo_met_s"], " s"), "", "", "", str(best),
                     fmt(ref["throughput"], "", 0), fmt(None if share is None else share * 100, " %"), "", "",
                     str(ref["load"]["requests_failed"]), ""])
        print(table(["", "SLO met (for good)", "last breach", "acted", "converged", "value", "tokens/s (settled)",
                     "requests within SLO", "in the episode", "sent after acting", "failed", "vs best static"],
                    rows))
        for arm, run in arms.items():
            print(f"{arm}: first met at {fmt(run['slo_first_met_s'], ' s')}; settled span "
                  f"{run['settled_span_s']:.0f} s; 256 before the governor: "
                  f"{fmt(run['throughput_at_256'], ' tokens/s', 0)}")
        print(host_note())
    write_json(args.out, "governor", doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
