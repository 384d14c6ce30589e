"""Governor: is there a load where --max-num-seqs 256 misses the TTFT SLO and a lower static value meets it?

The default ``ttft-slo`` policy (``controlplane/policy/defaults``) governs ``--max-num-seqs`` on TTFT p99 >
500 ms with the ladder 256, 192, ... 16. Before a governed run can be judged ("meets the SLO within 5 minutes,
throughput within 10 % of the best static setting"), a sweep must find a load where 256 misses the SLO and
some lower static value meets it. This benchmark runs that sweep on the simulator's timing model with the
virtual clock (``enginesim.virtual_load.run_virtual_load``: closed-loop streams, the same shape the HTTP load
generator makes), over memory shares, stream counts and request shapes, and prints for each load every
ladder value's throughput, TTFT p99, ITL p99 and preemptions, then the verdict: the best static value that
meets the SLO (the governed run's throughput target) or "none".

    python bench/governor.py [--quick] [--duration 60] [--out bench/results/governor.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.figures import fmt, median, table, write_json
from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import ThresholdCondition
from controlplane.policy.loader import load_directory
from enginesim.profiles import H100_LLAMA_8B
from enginesim.virtual_load import run_virtual_load

# (gpu memory share, concurrent streams, prompt tokens, output tokens)
LOADS = [(0.9, 128, 512, 256), (0.9, 256, 512, 256), (0.9, 384, 256, 128),
         (0.5, 128, 512, 1024), (0.45, 160, 256, 768), (0.4, 96, 512, 512), (0.4, 64, 1024, 256)]
QUICK_LOADS = [(0.9, 256, 512, 256), (0.4, 96, 512, 512)]


def default_governor() -> tuple[float, list[int], float]:
    """The TTFT threshold and ladder of the shipped ``ttft-slo`` policy, and ``itl-slo``'s ITL threshold."""
    policies = {p.name: p for p in load_directory()}
    ttft, itl = policies["ttft-slo"], policies["itl-slo"]
    assert isinstance(ttft.condition, ThresholdCondition) and isinstance(ttft.action, LowerMaxNumSeqsAction)
    assert isinstance(itl.condition, ThresholdCondition)
    return ttft.condition.threshold, sorted(set(ttft.action.ladder or [256]), reverse=True), itl.condition.threshold


def sweep(load: tuple[float, int, int, int], ladder: list[int], slo: float, itl_slo: float,
          duration: float) -> dict[str, Any]:
    util, streams, prompt, output = load
    rows = []
    for seqs in ladder:
        r = run_virtual_load(H100_LLAMA_8B, max_num_seqs=seqs, concurrency=streams, prompt_tokens=prompt,
                             output_tokens=output, duration=duration, gpu_memory_utilization=util)
        rows.append({"max_num_seqs": seqs, "tokens_per_s": r.tokens_per_s, "ttft_p99_s": r.ttft_p99,
                     "itl_p99_s": r.itl_p99, "preemptions": r.preemptions, "meets_slo": r.ttft_p99 <= slo,
                     "meets_itl_slo": r.itl_p99 <= itl_slo})
    top = next(r for r in rows if r["max_num_seqs"] == max(ladder))
    meeting = [r for r in rows if r["meets_slo"]]
    best = max(meeting, key=lambda r: r["tokens_per_s"]) if meeting else None
    # What a governor on inter-token latency (itl-slo's threshold; it alerts today) would have to settle on.
    itl_best = max((r for r in rows if r["meets_itl_slo"]), key=lambda r: r["tokens_per_s"], default=None)
    return {"gpu_memory_utilization": util, "streams": streams, "prompt_tokens": prompt, "output_tokens": output,
            "rows": rows, "top_misses_slo": not top["meets_slo"],
            "best_static": best["max_num_seqs"] if best else None,
            "best_static_tokens_per_s": best["tokens_per_s"] if best else None,
            "qualifies": (not top["meets_slo"]) and best is not None,
            "itl": {"top_misses": not top["meets_itl_slo"],
                    "best_static": itl_best["max_num_seqs"] if itl_best else None,
                    "throughput_vs_top": itl_best["tokens_per_s"] / top["tokens_per_s"] if itl_best else None}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two loads, 30 virtual seconds each")
    p.add_argument("--duration", type=float, default=60.0, help="virtual seconds per point")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "governor.json")
    args = p.parse_args()
    loads = QUICK_LOADS if args.quick else LOADS
    duration = 30.0 if args.quick else args.duration
    slo, ladder, itl_slo = default_governor()
    started = time.monotonic()
    results = []
    for load in loads:
        res = sweep(load, ladder, slo, itl_slo, duration)
        results.append(res)
        print(f"\n--gpu-memory-utilization {res['gpu_memory_utilization']}, {res['streams']} streams x "
              f"{res['prompt_tokens']}+{res['output_tokens']} tokens, {duration:g} s virtual clock")
        print(table(["max_num_seqs", "tokens/s", "TTFT p99", "ITL p99", "preempt", f"TTFT<={slo:g}s",
                     f"ITL<={itl_slo:g}s"],
                    [[str(r["max_num_seqs"]), f"{r['tokens_per_s']:.0f}", fmt(r["ttft_p99_s"], " s", 2),
                      fmt(r["itl_p99_s"] * 1000, " ms"), str(r["preemptions"]), "yes" if r["meets_slo"] else "no",
                      "yes" if r["meets_itl_slo"] else "no"] for r in res["rows"]]))
        verdict = ("256 meets the SLO: nothing to govern" if not res["top_misses_slo"] else
                   f"256 misses; best static that meets it: {res['best_static']} "
                   f"({res['best_static_tokens_per_s']:.0f} tokens/s)" if res["qualifies"] else
                   "256 misses and no lower value meets it: lowering cannot restore TTFT here")
        print(f"verdict: {verdict}", flush=True)
        itl = res["itl"]
        if itl["top_misses"] and itl["best_static"] is not None:
            print(f"on ITL p99 <= {itl_slo:g} s instead: best static {itl['best_static']}, "
                  f"{itl['throughput_vs_top']:.0%} of 256's throughput", flush=True)
    qualifying = [r for r in results if r["qualifies"]]
    print(f"\n{len(qualifying)} of {len(results)} loads qualify for a governed run (256 misses TTFT p99 <= "
          f"{slo:g} s and a lower static value meets it); sweep took {time.monotonic() - started:.0f} s "
          f"(virtual clock: no host contention in these figures)")
    write_json(args.out, "governor", {
        "settings": {"slo_ttft_p99_s": slo, "slo_itl_p99_s": itl_slo, "ladder": ladder, "duration_virtual_s": duration,
                     "profile": H100_LLAMA_8B.name, "clock": "virtual (enginesim.virtual_load)"},
        "qualifying_loads": len(qualifying), "loads": results,
        "median_best_static_tokens_per_s": median([r["best_static_tokens_per_s"] for r in qualifying])})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
