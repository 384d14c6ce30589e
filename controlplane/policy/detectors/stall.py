"""Stall: an engine that answers but makes no progress. ``docs/design.md`` ("Progress") has the whole table.

/health stays 200 on a wedged EngineCore (vLLM #39863, #17972, #43423), and its gauges cannot be trusted: a
frozen core publishes nothing, so running and waiting may read 0 while clients' requests hang (vLLM PR
#46811). Progress is judged from what a wedge cannot fake, over the policy's whole ``for:``:

- the agent's own verdict, WEDGED (its canaries failed in a row while no generation token moved), with no
  token for ``for:`` or the verdict itself that old;
- a canary failing all along while no generation token moved, whatever the gauges say;
- work queued or running all along while no generation token moved (the gauges still publishing), confirmed
  by a failed canary when ``require_canary_failure`` is set.

Tokens moving rule the rest out: a slow canary under a full batch is a busy engine, not a wedged one
(ray#54070), and restarting it would only drop the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from agent.wire import ReplicaState
from controlplane.policy.conditions import StallCondition
from controlplane.policy.detectors.findings import Finding, covering, due_at, evidence_of, upto
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import Replica, ReplicaSample

FIELDS = ["requests_running", "requests_waiting", "generation_tokens_total", "generation_tokens_per_second",
          "canary_ok", "canary_ttft_seconds"]


def _queued(sample: ReplicaSample) -> bool:
    return _in_flight(sample) > 0


def _in_flight(sample: ReplicaSample) -> float:
    return (sample.requests_running or 0) + (sample.requests_waiting or 0)


def tokens_moved(run: list[ReplicaSample]) -> bool | None:
    """Whether generation advanced over the run; None when neither the counter nor the rate was read."""
    totals = [s.generation_tokens_total for s in run if s.generation_tokens_total is not None]
    if len(totals) >= 2:
        return totals[-1] > totals[0]  # a counter reset (restart) also reads as not moving: state guards that
    rates = [s.generation_tokens_per_second for s in run if s.generation_tokens_per_second is not None]
    if rates:
        return any(r > 0 for r in rates)
    return None


def canary_failing(run: list[ReplicaSample]) -> bool:
    """Every canary reading over the run failed (at least one was read): not one blip among successes."""
    readings = [s.canary_ok for s in run if s.canary_ok is not None]
    return bool(readings) and not any(readings)


def is_busy(cond: StallCondition, replica: Replica, latest: ReplicaSample) -> bool:
    """A full batch: requests running at (or near) the engine's max-num-seqs."""
    limit = replica.max_num_seqs or latest.max_num_seqs
    return limit is not None and (latest.requests_running or 0) >= cond.busy_ratio * limit


def requests_lost(history: Sequence[ReplicaSample], run: list[ReplicaSample]) -> float:
    """The requests the engine held when it last made progress: a restart loses them anyway.

    The agent's count when it judged the replica WEDGED (client connections open to the engine), else the
    gauges: the last sample before the run whose tokens moved and the one before it, and the run itself (a
    frozen core's gauges read 0 or keep their last values: either way the last live reading is the count). A
    sample's token rate covers the time since the one before, but its gauges are read at its own moment, which
    may already be after the freeze: the sample before it read them while the engine still had tokens to make."""
    start = run[0].at
    before = [s for s in history if s.at < start]
    i = next((i for i in range(len(before) - 1, -1, -1) if (before[i].generation_tokens_per_second or 0) > 0), None)
    live = [] if i is None else before[max(0, i - 1):i + 1]
    gauges = [_in_flight(s) for s in live + run]
    counted = [float(s.requests_lost) for s in run if s.requests_lost is not None]  # the agent's own count
    return max(gauges + counted, default=0.0)


def stall_due(cond: StallCondition, replica: Replica, now: datetime) -> datetime | None:
    """When ``detect_stall`` finds a WEDGED replica's stall if nothing changes: ``for:`` after the first sample
    that read the generation counter at its latest value, or after the verdict; None when it is not WEDGED, or
    is a stall already. A replica still serving is left to the rounds' usual pace."""
    if replica.state != ReplicaState.WEDGED:
        return None
    held = None if replica.state_since is None else replica.state_since + timedelta(seconds=cond.for_)
    if held is not None and held <= now:
        return None
    counted = [s for s in replica.history if s.generation_tokens_total is not None]
    end = upto(counted, now)
    flat = None
    if end:
        latest = counted[end - 1].generation_tokens_total
        flat = due_at(counted, now, cond.for_, lambda s: s.generation_tokens_total == latest)
    return min((d for d in (held, flat) if d is not None), default=None)


def detect_stall(cond: StallCondition, replica: Replica, now: datetime) -> Finding | None:
    """A finding when a replica made no progress for the whole window (see the module's rules)."""
    wedged = replica.state == ReplicaState.WEDGED
    if not (replica.serving or wedged):
        return None
    run = covering(replica.history, now, cond.for_)
    if wedged:
        # The agent's verdict already carries its confirmation (canaries failed in a row), and only a restart
        # brings a WEDGED replica back: waiting out ``for:`` on top of it would only keep the capacity away. So
        # it is a stall once no token moved for ``for:`` (counted from the last token, not from the verdict),
        # or once the verdict itself has held that long (its engine may no longer answer /metrics).
        since = replica.state_since
        flat = run is not None and tokens_moved(run) is False
        held = since is not None and now - since >= timedelta(seconds=cond.for_)
        if not (flat or held):
            return None
        run = run or [s for s in replica.history if since is None or s.at >= since] or list(replica.history[-1:])
        if not run:
            return None
        why = ("the agent judged it WEDGED" + (f" {format_duration((now - since).total_seconds())} ago"
                                                 if since is not None else "")
               + (f", no generation token for {format_duration(cond.for_)}" if flat else ""))
    else:
        if run is None:
            return None
        if replica.state_since is not None and now - replica.state_since < timedelta(seconds=cond.for_):
            # Serving for less than the window: the readings before it are of an engine starting (and the last
            # canary an agent reported then may be the previous engine's), not of this one making no progress.
            return None
        moved = tokens_moved(run)
        if moved is None or moved:
            return None  # tokens moving: busy or slow, never wedged
        confirmed = any(s.canary_ok is False for s in run) or not cond.require_canary_failure
        if not (canary_failing(run) or (confirmed and all(_queued(s) for s in run))):
            return None
        why = f"no generation token for {format_duration(cond.for_)}"
    latest = run[-1]
    lost = requests_lost(replica.history, run)
    canary_failed = any(s.canary_ok is False for s in run)
    return Finding(
        detector="stall",
        subject=replica.key,
        summary=f"{(latest.requests_running or 0):g} running / {(latest.requests_waiting or 0):g} waiting; {why}"
        + ("; canary failed" if canary_failed else "")
        + ("; batch is full, yet no token moved" if is_busy(cond, replica, latest) else "")
        + (f"; {lost:g} in-flight request(s) are lost with the engine" if lost else ""),
        measured={"generation_tokens_total": latest.generation_tokens_total, "canary_failed": canary_failed,
                  "wedged": wedged, "requests_lost": lost},
        evidence=evidence_of(run, FIELDS),
    )
