"""Stall: work queued while no token is generated, confirmed by a failed canary.

/health stays 200 on a wedged EngineCore (vLLM #39863, #17972, #43423), so progress is the only signal. A
slow canary under a full batch is not a stall: with running near max-num-seqs and tokens still moving the
engine is busy, not wedged (ray#54070) — restarting it would only drop the batch.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.policy.conditions import StallCondition
from controlplane.policy.detectors.findings import Finding, covering, evidence_of
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Replica, ReplicaSample

FIELDS = ["requests_running", "requests_waiting", "generation_tokens_total", "generation_tokens_per_second",
          "canary_ok", "canary_ttft_seconds"]


def _queued(sample: ReplicaSample) -> bool:
    return (sample.requests_running or 0) + (sample.requests_waiting or 0) > 0


def tokens_moved(run: list[ReplicaSample]) -> bool | None:
    """Whether generation advanced over the run; None when neither the counter nor the rate was read."""
    totals = [s.generation_tokens_total for s in run if s.generation_tokens_total is not None]
    if len(totals) >= 2:
        return totals[-1] > totals[0]  # a counter reset (restart) also reads as not moving: state guards that
    rates = [s.generation_tokens_per_second for s in run if s.generation_tokens_per_second is not None]
    if rates:
        return any(r > 0 for r in rates)
    return None


def is_busy(cond: StallCondition, replica: Replica, latest: ReplicaSample) -> bool:
    """A full batch: requests running at (or near) the engine's max-num-seqs."""
    limit = replica.max_num_seqs or latest.max_num_seqs
    return limit is not None and (latest.requests_running or 0) >= cond.busy_ratio * limit


def detect_stall(cond: StallCondition, replica: Replica, now: datetime) -> Finding | None:
    """A finding when a serving replica had work for the whole window and generated nothing."""
    if not replica.serving:
        return None
    run = covering(replica.history, now, cond.for_)
    if run is None or not all(_queued(s) for s in run):
        return None
    moved = tokens_moved(run)
    if moved is None or moved:
        return None  # tokens moving: busy or slow, never wedged
    canary_failed = any(s.canary_ok is False for s in run)
    if cond.require_canary_failure and not canary_failed:
        return None
    latest = run[-1]
    return Finding(
        detector="stall",
        subject=replica.key,
        summary=f"{(latest.requests_running or 0):g} running / {(latest.requests_waiting or 0):g} waiting and no "
        f"generation token for {format_duration(cond.for_)}"
        + ("; canary failed" if canary_failed else "")
        + ("; batch is full, yet no token moved" if is_busy(cond, replica, latest) else ""),
        measured={"generation_tokens_total": latest.generation_tokens_total, "canary_failed": canary_failed},
        evidence=evidence_of(run, FIELDS),
    )
