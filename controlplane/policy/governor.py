"""The max-num-seqs governor: lower under SLO pressure, canary first; raise again with hysteresis.

vLLM fixes --max-num-seqs at start (docs/design.md: every scheduler flag), so each step is a restart with new
arguments, except where the model's replicas run the live-cap plug-in (``live_limits: true``, active): there a
step within the engines' startup limit is a live cap (``set_live_cap``), no restart and no drain, and only a
step above it (a raise past the startup value) restarts, lifting the cap. Lowering goes to one replica first;
once that canary has met the SLO for the condition's duration, its value is promoted to the model's other
breaching replicas. Raising waits until the SLO has been met with margin for longer (``raise.for``) and never
returns to a value that broke the SLO within ``raise.remember`` — so the fleet settles on the largest value that
meets the SLO instead of oscillating.

How far to lower (``step``):

- ``ladder``: the next rung down (or ``current * factor``), one per breach.
- ``proportional``: decode inter-token latency grows roughly linearly with the running batch (each step
  costs a fixed part plus a part per sequence, and the prefills that stall decode steps come from the
  sequences that finish), so from the breaching replica's measured latency ``L`` and its mean running batch
  ``B``, the batch predicted to meet ``threshold * headroom`` is ``B * threshold * headroom / L``. Both are
  the breach as it stands, read over the last half of the condition's window: ``L`` the median of its
  readings beyond the threshold, ``B`` its mean (a surge's first seconds, every stream prefilling at once
  while more arrive, overstate the latency and understate the batch; a ``B`` from the whole window sized a
  step to a batch the replica no longer ran, and its canary lost too much throughput). A breach with no
  reading beyond the threshold in that half has passed (a surge as the load arrived): one rung, not a jump
  sized on it. The new value is the
  largest rung at or below the prediction, always at least one rung below the current value and never below
  ``min``. The line through the origin overestimates how much a smaller batch helps when the fixed part is
  large; ``headroom`` absorbs that, an undershoot is recovered by the raise path, and a breach that remains is
  judged again from the new value. Without a running batch reading it falls back to one rung.

What lowering costs is watched too: with ``max_throughput_drop`` set, a replica already below its peers whose
generation throughput is more than that fraction below theirs is not lowered further (an alert says the SLO
needs capacity, not a smaller batch) and its value is not promoted; the same figure bounds the canary's
throughput when it is judged. TTFT is not a brake: a smaller batch under load moves queueing into TTFT by
design, and ``ttft-slo`` alerts on it.

A condition with ``min_share`` below 1 (bursty per-scrape percentiles) breaches when that share of the
readings over ``for`` is beyond the threshold, and counts as met when fewer are.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial

from agent.wire import ReplicaState
from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import Op, ThresholdCondition
from controlplane.policy.detectors.findings import Finding, covering, covering_span, evidence_of, since
from controlplane.policy.detectors.slo import OPS, detect_threshold, signal_holds
from controlplane.policy.durations import format_duration
from controlplane.policy.kinds import ActionKind
from controlplane.policy.live_cap import takes
from controlplane.policy.memory import (
    INVERSE,
    Candidate,
    KeptReadings,
    Raising,
    Readings,
    Views,
    comfortable,
    throughput_ratios,
)
from controlplane.policy.payloads import AlertPayload, Judge, MaxNumSeqsPayload, SetLiveCapPayload, governed_flag
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction, Target, replica_target
from controlplane.policy.rungs import at_generation, past_max_num_seqs
from controlplane.policy.snapshot import FlagTrial, Replica, ReplicaSample

# A replica in these states is on its way to a new value (or out for one): a change in flight.
SETTLING = frozenset({ReplicaState.STARTING, ReplicaState.WARMING, ReplicaState.DRAINING, ReplicaState.STOPPING})


def lower_value(current: int, action: LowerMaxNumSeqsAction) -> int | None:
    """The next value down from ``current`` (ladder rung below, else current * factor), never below min."""
    if action.ladder:
        below = [v for v in sorted(set(action.ladder)) if v < current]
        new = below[-1] if below else action.min
    else:
        new = math.floor(current * action.factor)
    new = max(new, action.min)
    return new if new < current else None


def raise_value(current: int, action: LowerMaxNumSeqsAction, maximum: int) -> int | None:
    """The next value up from ``current`` (ladder rung above, else current / factor), capped at maximum."""
    if action.ladder:
        above = [v for v in sorted(set(action.ladder)) if v > current]
        new = above[0] if above else maximum
    else:
        new = math.ceil(current / action.factor)
    new = min(new, maximum)
    return new if new > current else None


def batch_target(samples: Sequence[ReplicaSample], signal: str, threshold: float, headroom: float,
                 now: datetime, seconds: float) -> float | None:
    """The running batch predicted to bring ``signal`` to ``threshold * headroom`` (latency ~ batch).

    Latency and batch are read over the same stretch, the last half of the window, since a surge's first
    seconds overstate the steady level (every stream prefilling at once) and understate the batch (the
    streams still arriving): the latency modelled is the median of its readings beyond the threshold, the
    batch its mean running one. None (one rung, not a jump) when that half holds no reading beyond the
    threshold: the breach was a transient that has passed (a surge as the load arrived, and readings well under
    the threshold since), and a step sized on it would overshoot. None too when the samples carry no latency
    or running-batch reading to model from.
    """
    half = now - timedelta(seconds=seconds / 2)
    late = [(float(v), float(s.requests_running)) for s in samples
            if s.at >= half and (v := getattr(s, signal)) is not None and s.requests_running is not None]
    beyond = [v for v, _ in late if v > threshold]
    if not beyond:
        return None
    latency = statistics.median(beyond)
    batch = sum(b for _, b in late) / len(late)
    if latency <= 0 or batch <= 0:
        return None
    return batch * threshold * headroom / latency


def proportional_value(current: int, action: LowerMaxNumSeqsAction, target: float | None) -> int | None:
    """The largest rung at or below ``target``, at least one step below ``current``, never below min."""
    one_step = lower_value(current, action)
    if one_step is None or target is None:
        return one_step
    if action.ladder:
        fits = [v for v in sorted(set(action.ladder)) if v <= target]
        new = fits[-1] if fits else action.min
    else:
        new = math.floor(target)
    return max(min(new, one_step), action.min)


def _recent(samples: Sequence[ReplicaSample], now: datetime, seconds: float) -> list[ReplicaSample]:
    return list(since(samples, now - timedelta(seconds=seconds), now))


def current_value(replica: Replica, action: LowerMaxNumSeqsAction) -> int:
    """The running limit the governor steps from: the live cap asked (live limits active), else --max-num-seqs."""
    return replica.running_limit or action.assumed_default


def at_value(replica: Replica, value: int) -> list[ReplicaSample]:
    """History read while the engine ran with ``value`` and its other flags as now (samples of an older value,
    or from before a flag rung, say nothing about it); the value a reading ran under is its live cap where one
    was in effect."""
    return list(Readings(replica).at_value(value))


def live_step(replicas: Sequence[Replica], value: int) -> bool:
    """Whether a step to ``value`` is a live cap on every one of ``replicas`` (their plug-ins active, and the
    value within each engine's startup limit), rather than a restart with a new --max-num-seqs."""
    return all(takes(r.live_limits, value) for r in replicas)


def _change(policy: Policy, action: LowerMaxNumSeqsAction, kind: str, replicas: Sequence[Replica], value: int,
            previous: int, reason: str, findings: list[Finding], target: Target) -> ProposedAction:
    # One replica is a canary (when the policy says so): judged beside its peers, then rolled to them. What it
    # is judged on: the governed signal (TTFT is expected to rise when the batch shrinks under load; ttft-slo
    # alerts on it), and how much throughput a lowering may cost.
    canary = action.canary and target.kind == "replica"
    judge = (Judge(latencies=[policy.condition.signal], max_throughput_drop=action.max_throughput_drop)
             if isinstance(policy.condition, ThresholdCondition) else None)
    if live_step(replicas, value):
        # No restart, no drain: the engines' plug-ins take the cap at their next step (docs/design.md, "Live cap").
        first = replicas[0].live_limits
        assert first is not None
        live = SetLiveCapPayload(live_cap=value, previous=first.asked, canary=canary, judge=judge)
        return ProposedAction(
            policy=policy.name, target=target, payload=live, replicas=[r.key for r in replicas],
            model=replicas[0].model, reason=f"{reason}, as a live cap (no restart)", findings=findings,
            runbook_url=policy.runbook_url)
    change = MaxNumSeqsPayload(
        kind=ActionKind.LOWER_MAX_NUM_SEQS if kind == "lower" else ActionKind.RAISE_MAX_NUM_SEQS, max_num_seqs=value,
        previous=previous, canary=canary, judge=judge, flag=governed_flag(replicas[0].engine))
    args = {r.key: change.derive(r.engine_args) for r in replicas}
    return ProposedAction(
        policy=policy.name, target=target, payload=change.model_copy(update={"engine_args": args}),
        replicas=[r.key for r in replicas], model=replicas[0].model, reason=reason, findings=findings,
        runbook_url=policy.runbook_url,
    )


def govern_model(policy: Policy, cond: ThresholdCondition, action: LowerMaxNumSeqsAction,
                 replicas: Sequence[Replica], now: datetime,
                 trials: Sequence[FlagTrial] = (), kept: KeptReadings | None = None) -> list[ProposedAction]:
    """Governor decisions for one model's managed replicas (serving ones are judged; restarting ones wait);
    ``trials``: flag rungs recently taken back on the fleet; ``kept``: readings kept from earlier rounds."""
    replicas = [r for r in replicas if r.serving or r.state in SETTLING]
    if any(r.converging for r in replicas):
        return []  # a change (a rollback, a restart) is on its way: proposals would start from stale arguments
    cur = {r.key: current_value(r, action) for r in replicas}
    # Every decision below reads a replica's history at its current value: filtered once, here, one replica at a
    # time, with all a round reads of it while it is at hand (a 1,000-node fleet has 8,000 histories).
    read: dict[int, Readings] = {}
    breaches: dict[str, tuple[Finding, bool] | None] = {}
    raising = None if action.raise_ is None else Raising(cond, action, partial(_step_up, action), now)
    for r in replicas:
        key, serving = r.key, r.serving
        history = read[id(r)] = Readings(r) if kept is None else kept.of(r)
        found = breaches[key] = _breach(cond, action, r, history, cur[key], now) if serving else None
        if raising is None:
            continue
        if not serving or covering_span(history.at_value(cur[key]), now, cond.for_) is None:
            raising = None  # one change in flight per model: let the last one prove itself
            continue
        raising.paused = raising.paused or found is not None  # a breach: the model is most likely lowered
        raising.consider(r, history, cur[key])
    views: Views = {id(r): read[id(r)].at_value(cur[r.key]) for r in replicas}
    findings = {key: None if b is None else b[0] for key, b in breaches.items()}
    pressured = {key for key, b in breaches.items() if b is not None and b[1]}
    breaching = [r for r in replicas if findings[r.key] is not None]
    if breaching:
        ratio = throughput_ratios(replicas, cur, views, cond.for_, now)
        return _lower(policy, cond, action, replicas, breaching, cur, views, ratio, findings, pressured, now, trials)
    chosen = None if raising is None else raising.chosen(replicas, read)
    return [] if chosen is None else [_raised(policy, cond, action, read, *chosen)]


def _step_up(action: LowerMaxNumSeqsAction, value: int) -> int | None:
    assert action.raise_ is not None
    return raise_value(value, action, action.raise_.max)


def _breach(cond: ThresholdCondition, action: LowerMaxNumSeqsAction, replica: Replica, history: Readings,
            value: int, now: datetime) -> tuple[Finding, bool] | None:
    """(finding, from a pressure condition): the SLO breach at the replica's current value, else the first
    ``pressure`` condition that holds."""
    samples = history.at_value(value)
    for condition in (cond, *action.pressure):
        if condition.min_share > 0 and not history.value_column(value, condition.signal).some(
                0, len(samples), condition.op, condition.threshold):
            continue  # no reading at this value is beyond the threshold: no share of any window is
        found = detect_threshold(condition, replica, now, samples)
        if found is not None:
            return found, condition is not cond
    return None


def _lower(policy: Policy, cond: ThresholdCondition, action: LowerMaxNumSeqsAction, replicas: Sequence[Replica],
           breaching: list[Replica], cur: dict[str, int], views: Views, ratio: Callable[[Replica], float | None],
           findings: dict[str, Finding | None], pressured: set[str], now: datetime,
           trials: Sequence[FlagTrial]) -> list[ProposedAction]:
    out: list[ProposedAction] = []
    top = max(cur[b.key] for b in breaching)
    # A replica equal to a breaching one has its key: only those are compared whole.
    keys = {b.key for b in breaching}
    lower = [r for r in replicas if cur[r.key] < top and (r.key not in keys or r not in breaching)]
    inverse = INVERSE[cond.op]
    # Proven: met the SLO for the condition's duration without costing more throughput than allowed (a
    # canary that did is rolled back by its judge, and its value must not be promoted meanwhile). No pressure
    # condition holds on these either: a replica under one is in ``breaching``, not in ``lower``.
    proven = [r for r in lower if r.serving and _met(views[id(r)], now, cond, inverse)
              and _throughput_drop(r, ratio, action) is None]
    if proven:
        value = max(cur[r.key] for r in proven)
        promote = [b for b in breaching if cur[b.key] > value]
        if promote:
            canary = max(proven, key=lambda r: cur[r.key])
            out.append(_change(
                policy, action, "lower", promote, value, max(cur[b.key] for b in promote),
                f"promote canary value {value} (met the SLO on {canary.key} for {format_duration(cond.for_)}) to "
                f"{len(promote)} breaching replica(s) of {promote[0].model}, one at a time",
                [f for b in promote if (f := findings[b.key]) is not None],
                Target(kind="model", model=promote[0].model)))
        rest = [b for b in breaching if cur[b.key] <= value]
    elif lower:
        # A canary is still proving itself; only a breach at or below its value may go lower.
        rest = [b for b in breaching if cur[b.key] <= min(cur[r.key] for r in lower)]
    else:
        rest = breaching
    # A peer restarting, or restarted within the condition's duration, moved its load onto the others: their
    # readings since are not their steady state. New lowerings wait until every replica's engine has run that
    # long (promoting a proven canary value does not: the canary met the SLO on its own readings).
    if any(not r.serving or covering(_since_restart(r), now, cond.for_) is None for r in replicas):
        rest = []
    if rest and action.canary:
        # Values above the lowest breaching one are known bad: deepen there, one replica at a time.
        lowest = min(cur[b.key] for b in rest)
        at_lowest = [b for b in rest if cur[b.key] == lowest]
        # The policy's own signal first: a latency breach outranks a pressure one in picking the canary.
        slo = [b for b in at_lowest if b.key not in pressured]
        rest = [_worst(slo or at_lowest, cond, findings)]
    for replica in rest:
        finding = findings[replica.key]
        assert finding is not None
        pressure = replica.key in pressured
        drop = _throughput_drop(replica, ratio, action)
        # A pressure breach steps one rung: the proportional model is the policy's latency's, not preemptions'.
        new = None if drop is not None else (lower_value(cur[replica.key], action) if pressure else
                                             _next_lower(views[id(replica)], cur[replica.key], cond, action, now))
        if new is None:
            why = (f"not lowering max-num-seqs below {cur[replica.key]}: {drop}" if drop is not None else
                   f"max-num-seqs is already at its floor {action.min}")
            if pressure:  # the flag rungs are for latency: pressure past the floor needs capacity
                out.append(ProposedAction(
                    policy=policy.name, target=replica_target(replica),
                    payload=AlertPayload(severity="warning", governed=True), model=replica.model, findings=[finding],
                    reason=f"{finding.summary}; {why}: the KV cache needs room (--gpu-memory-utilization, a shorter "
                    "--max-model-len, more GPUs) or the model more replicas", runbook_url=policy.runbook_url))
                continue
            out += past_max_num_seqs(policy, cond, action, replica, finding, why, current_value(replica, action),
                                     now, trials)
            continue
        how = "canary on one replica first, then promote to the others" if action.canary else "each replica"
        out.append(_change(
            policy, action, "lower", [replica], new, cur[replica.key],
            f"{finding.summary}: lower max-num-seqs {cur[replica.key]} -> {new} ({how})",
            [finding], replica_target(replica)))
    return out


def _since_restart(replica: Replica) -> Sequence[ReplicaSample]:
    """``rungs.at_generation``: the readings of the engine the replica runs now; the whole history when every
    reading is of it (the usual case, told without a scan in Python)."""
    history = replica.history
    if {s.generation for s in history} <= {None, replica.generation}:
        return history
    return at_generation(replica)


def _next_lower(samples: list[ReplicaSample], current: int, cond: ThresholdCondition,
                action: LowerMaxNumSeqsAction, now: datetime) -> int | None:
    """The value a breaching replica steps down to from ``current`` (``samples``: its history at that value)."""
    if action.step == "ladder":
        return lower_value(current, action)
    window = _recent(samples, now, cond.for_)
    target = batch_target(window, cond.signal, cond.threshold, action.headroom, now, cond.for_)
    return proportional_value(current, action, target)


def _met(samples: list[ReplicaSample], now: datetime, cond: ThresholdCondition, inverse: Op) -> bool:
    """The SLO met over the condition's duration: every sample (a share condition: under its share beyond)."""
    if cond.min_share >= 1:
        return signal_holds(samples, now, cond.signal, inverse, cond.threshold, cond.for_) is not None
    run = covering(samples, now, cond.for_)
    if run is None:
        return False
    known = [float(v) for s in run if (v := getattr(s, cond.signal)) is not None]
    return bool(known) and sum(1 for v in known if OPS[cond.op](v, cond.threshold)) < cond.min_share * len(known)


def _throughput_drop(replica: Replica, ratios: Callable[[Replica], float | None],
                     action: LowerMaxNumSeqsAction) -> str | None:
    """Why lowering ``replica`` further costs too much throughput (``ratios``: ``throughput_ratios`` of the
    model's replicas over the condition's duration), or None."""
    if action.max_throughput_drop is None:
        return None
    ratio = ratios(replica)
    if ratio is None or ratio >= 1 - action.max_throughput_drop:
        return None
    return (f"its generation throughput is already {1 - ratio:.0%} below its peers' at higher values (allowed "
            f"{action.max_throughput_drop:.0%}): the SLO needs capacity, not a smaller batch")


def _worst(rest: list[Replica], cond: ThresholdCondition, findings: dict[str, Finding | None]) -> Replica:
    def latest(r: Replica) -> tuple[float, str]:
        f = findings[r.key]
        return (f.figure("latest") if f else 0.0, r.key)

    return max(rest, key=latest) if cond.op[0] == ">" else min(rest, key=latest)


def _raised(policy: Policy, cond: ThresholdCondition, action: LowerMaxNumSeqsAction, read: dict[int, Readings],
            candidate: Candidate, ceiling: int | None) -> ProposedAction:
    """The raise of the candidate replica, on its readings that met the SLO with margin (``ceiling``: the smallest
    value that broke it lately)."""
    replica, value, up, (first, end) = candidate
    spec = action.raise_
    assert spec is not None
    margin = comfortable(cond, spec.margin)
    run = read[id(replica)].at_value(value)[first:end]
    finding = Finding(
        detector="threshold", subject=replica.key,
        summary=f"{cond.signal} {INVERSE[cond.op]} {margin:.4g} for {format_duration(spec.for_)} "
        f"at max-num-seqs {value}",
        measured={"ceiling": ceiling}, evidence=evidence_of(run, [cond.signal, "max_num_seqs"]))
    return _change(policy, action, "raise", [replica], up, value,
                   f"{finding.summary}: raise max-num-seqs {value} -> {up} (one replica at a time"
                   + (f"; never back to {ceiling}, which broke the SLO recently)" if ceiling else ")"),
                   [finding], replica_target(replica))
