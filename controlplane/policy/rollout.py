"""Rollouts as a pure step: ``step(action, plan, observed, now, settings) -> Step(plan, writes, verdict)``.

A rollout (a rolling restart, an engine-argument change of several replicas, or a canary) is one action whose
whole progress is its ``RolloutPlan``, kept in the action, so a control plane that restarts mid-rollout, or a
new leader, carries on from the batch it was in. Each round the caller reads what the step needs (the model's
replicas as last reported, and in the canary phase their recent samples), calls ``step``, then writes what it
returns: the plan, the desired-state ``writes``, and the verdict, if the rollout is over. Nothing here reads
the store or a clock.

When the current batch reports READY at its new generation, and has stayed so for ``settle`` (the time a load
balancer's health checks take to put it back in rotation), the next batch starts, if the model's disruption
budget still holds without it (drain -> stop -> start -> warm -> READY is the agent's). A canary (a governed
``--max-num-seqs`` change or live cap, or a flag rung, on one replica with peers) first converges on its own,
then runs beside its peers. ``evidence.judge_evidence`` judges it at every step, from the moment a live cap
took or from the second half of a restarted canary's window (the first is its warm-up under load), as soon as
the per-request latencies decide; ``canary.judge_canary``'s p99 comparison decides a window that ran out
undecided. The change is rolled to the peers (pass) or the canary gets its previous arguments or cap back
(fail -> ``rolled_back``).

A flag rung (``add_engine_flag``) is judged against a like-for-like baseline: the ready peers tuned as the
canary was before (its max-num-seqs, without the flag, on several GPUs for a multi-GPU rung); without any, the
canary's own readings over the half-window before its change. It must also cut the governed latency by the
rung's ``min_latency_gain``. On a pass it goes to the peers that take it and lack it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Protocol

from agent.wire import LiveLimits, ReplicaState
from controlplane.policy.canary import LATENCIES, CanaryVerdict, judge_canary
from controlplane.policy.evidence import judge_evidence
from controlplane.policy.guardrails import GuardConfig
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.live_cap import cap_progress, cap_words
from controlplane.policy.payloads import (
    AddEngineFlagPayload,
    CanaryVerdictRecord,
    Judge,
    MaxNumSeqsPayload,
    NewArgsPayload,
    Payload,
    RollingRestartPayload,
    RolloutPlan,
    SetLiveCapPayload,
)
from controlplane.policy.signals import ReplicaSample

RolloutPayload = RollingRestartPayload | NewArgsPayload | SetLiveCapPayload
CanaryPayload = NewArgsPayload | SetLiveCapPayload
Verdict = tuple[ActionState, str]


class Reported(Protocol):
    """What convergence needs of a replica as last reported (a store row or a ``ReplicaView``)."""

    @property
    def state(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def generation(self) -> int: ...
    @property
    def last_exit_code(self) -> int | None: ...


Progress = Literal["done", "pending", "fatal"]


def progress(replica: Reported | None, generation: int | None, *, was_fatal: bool = False) -> Progress:
    """Where one replica stands against the change asked of it: the one convergence rule.

    ``generation`` None is a drain: done once the replica is stopped (or no longer reported); the agent stops
    a FATAL one too. Otherwise done once it is READY (and ready) at that generation or a later one; FATAL
    fails the change, except at an older generation of a replica that was FATAL when the change began
    (``was_fatal``): that is the state a restart is asked to end, reported before the agent took the change.
    """
    if generation is None:
        return "done" if replica is None or replica.state == ReplicaState.STOPPED else "pending"
    if replica is not None and replica.state == ReplicaState.FATAL and (
            replica.generation >= generation or not was_fatal):
        return "fatal"
    converged = (replica is not None and replica.generation >= generation and replica.ready
                 and replica.state == ReplicaState.READY)
    return "done" if converged else "pending"


def fatal_reason(key: str, replica: Reported | None) -> str:
    return f"{key} is FATAL (exit code {None if replica is None else replica.last_exit_code})"


@dataclass(frozen=True)
class ReplicaView:
    """One replica of the model, as its agent last reported it."""

    key: str
    state: str
    ready: bool
    generation: int
    engine_args: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    managed: bool = True
    last_exit_code: int | None = None
    # The generation last asked of it (desired state): a new one is above both.
    desired_generation: int | None = None
    # Its live-cap plug-in as reported (None: live limits off).
    live_limits: LiveLimits | None = None

    @property
    def serving(self) -> bool:
        return self.ready and self.state == ReplicaState.READY


@dataclass(frozen=True)
class Observed:
    """What the caller read for one step: the model's replicas, and in the canary phase their samples since
    ``samples_since(plan, settings)``, scrape windows included, oldest first."""

    replicas: Mapping[str, ReplicaView]
    samples: Mapping[str, Sequence[ReplicaSample]] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutSettings:
    deadline: timedelta = timedelta(minutes=10)  # per batch
    # A batch READY at its new generation is done once it has been seen so for this long: a load balancer
    # puts a replica back in rotation only after its health checks pass (HAProxy's ``inter`` times ``rise``),
    # and the next batch must not leave rotation before it is back.
    settle: timedelta = timedelta(seconds=5)
    # The longest a canary is judged for: the evidence usually decides well before (``policy.evidence``).
    canary_window: timedelta = timedelta(minutes=2)
    # The chance of a wrong verdict over a whole window, and how often the judge looks (a scrape interval: a
    # new look needs a new window of readings).
    canary_alpha: float = 0.05
    canary_look: timedelta = timedelta(seconds=5)
    max_latency_regression: float = 0.10
    max_throughput_drop: float = 0.25
    guard: GuardConfig = field(default_factory=GuardConfig)  # the disruption budget, per model


@dataclass(frozen=True)
class DesiredWrite:
    """One desired-state change for the caller to write: ``engine_args`` None restarts the same arguments;
    ``live``: only the live cap, to ``live_cap``, with no restart; ``lift_cap``: a restart with a new
    --max-num-seqs, which is then the whole limit (no live cap stays to hold it lower)."""

    key: str
    engine_args: list[str] | None
    live: bool = False
    live_cap: int | None = None
    lift_cap: bool = False


@dataclass(frozen=True)
class Step:
    plan: RolloutPlan
    writes: list[DesiredWrite] = field(default_factory=list)
    verdict: Verdict | None = None


def is_rollout(payload: Payload, replicas: Sequence[str]) -> bool:
    """Whether the rollout runs this action: rolling restarts, multi-replica argument changes, canaries."""
    if isinstance(payload, RollingRestartPayload):
        return True
    if isinstance(payload, MaxNumSeqsPayload | AddEngineFlagPayload | SetLiveCapPayload):
        return len(replicas) > 1 or payload.canary
    return False


def samples_since(plan: RolloutPlan | None, settings: RolloutSettings) -> datetime | None:
    """From when the next step needs samples (a canary being judged, and its own readings before its change),
    or None when it needs none."""
    if plan is None or plan.phase != "canary" or plan.batch_started_at is None:
        return None
    return plan.batch_started_at - settings.canary_window / 2


def _next_generation(view: ReplicaView | None) -> int:
    if view is None:
        return 1
    return max(view.generation, view.desired_generation or 0) + 1


def _start_batch(action: RolloutPayload, plan: RolloutPlan, keys: Sequence[str], observed: Observed,
                 now: datetime) -> Step:
    writes, batch = [], {}
    for key in keys:
        view = observed.replicas.get(key)
        if isinstance(action, SetLiveCapPayload):
            # No new generation: the engine takes the cap where it runs, and convergence is the agent's report.
            writes.append(DesiredWrite(key, None, live=True, live_cap=action.live_cap))
            batch[key] = 0 if view is None else view.generation
            continue
        args = None if isinstance(action, RollingRestartPayload) else action.args_for(
            key, () if view is None else view.engine_args)
        writes.append(DesiredWrite(key, args, lift_cap=isinstance(action, MaxNumSeqsPayload)))
        batch[key] = _next_generation(view)
    return Step(plan.model_copy(update={"batch": batch, "batch_started_at": now, "batch_ready_at": None,
                                        "waiting": None}), writes)


def start(action: RolloutPayload, replicas: Sequence[str], observed: Observed, now: datetime) -> Step:
    """Plan the rollout, and start its first batch if it is a canary (a rolling rollout starts next step)."""
    if not isinstance(action, RollingRestartPayload) and action.canary and len(replicas) == 1:
        view = observed.replicas.get(replicas[0])
        plan = RolloutPlan(phase="canary", canary=replicas[0],
                           previous_args=[] if view is None else list(view.engine_args))
        return _start_batch(action, plan, replicas, observed, now)
    size = action.batch_size if isinstance(action, RollingRestartPayload) else 1
    keys = list(replicas)
    return Step(RolloutPlan(phase="rolling", queue=[keys[i:i + size] for i in range(0, len(keys), size)]))


def _budget_wait(model: str | None, batch: Sequence[str], observed: Observed, guard: GuardConfig) -> str | None:
    if model is None:
        return None
    members = list(observed.replicas.values())
    floor = guard.budget_for(model).floor(len(members))
    serving = [r for r in members if r.serving and r.key not in batch]
    if len(serving) < floor and any(k in {r.key for r in members if r.ready} for k in batch):
        return f"waiting: {len(serving)} other replica(s) of {model} READY, budget needs {floor}"
    return None


def _window(observed: Observed, key: str, since: datetime, until: datetime | None = None) -> list[ReplicaSample]:
    return [s for s in observed.samples.get(key, ()) if s.at >= since and (until is None or s.at < until)]


def _like_for_like(action: AddEngineFlagPayload, plan: RolloutPlan, peers: Sequence[ReplicaView]) -> list[ReplicaView]:
    """Peers tuned as the canary was before its change: its max-num-seqs and this flag's setting, on as many
    GPUs when the rung is for multi-GPU engines (ports and other per-instance arguments may differ)."""
    before = action.tuning(plan.previous_args or [])
    return [p for p in peers if p.ready and action.takes(p.engine_args, p.gpus) and action.tuning(p.engine_args)
            == before]


def _judge(action: CanaryPayload, plan: RolloutPlan, observed: Observed, now: datetime,
           settings: RolloutSettings) -> Step:
    """The canary phase once the canary is READY: judge on the evidence as it comes (at most for the window),
    then promote or roll back."""
    ready_at = plan.canary_ready_at or now
    plan = plan.model_copy(update={"canary_ready_at": ready_at,
                                   "canary_judged_at": plan.canary_judged_at or ready_at + settings.canary_window})
    key = plan.canary or ""
    peers = [r for r in observed.replicas.values() if r.key != key and r.managed]
    flag_rung = isinstance(action, AddEngineFlagPayload)
    # A lone replica has no peers to compare with: its own SLO is the governor's to judge, next round. A flag
    # rung always has a baseline (its own readings before the change, at worst).
    compared = bool(peers) or flag_rung
    # The governor says what the change is judged on (its signal, the throughput a lowering may cost).
    judge = action.judge or Judge()
    # A restarted canary is judged on the second half of the window: in the first, it warms up under live load
    # (a fresh engine's first steps are slower, and its empty batch refills all at once), which is not its
    # steady state. A live cap is taken at a step boundary by an engine already warm: judged from the moment
    # it took.
    live = isinstance(action, SetLiveCapPayload)
    since = ready_at if live else ready_at + settings.canary_window / 2
    if compared and now < since:
        return Step(plan)
    baseline_since = since
    if judge.baseline == "same_args" and isinstance(action, AddEngineFlagPayload):
        alike = _like_for_like(action, plan, peers)
        plan = plan.model_copy(update={"baseline": [p.key for p in alike] or "itself before the change"})
        started = plan.batch_started_at or now
        # Nobody runs the old arguments any more: the canary's own readings before its change.
        if not alike:
            baseline_since = started - settings.canary_window / 2
        baseline = ([_window(observed, p.key, since) for p in alike] if alike
                    else [_window(observed, key, baseline_since, started)])
    else:
        baseline = [_window(observed, p.key, since) for p in peers]
    latencies = judge.latencies or LATENCIES
    drop = settings.max_throughput_drop if judge.max_throughput_drop is None else judge.max_throughput_drop
    mine = _window(observed, key, since)
    verdict = None
    if compared:
        gain = judge.min_latency_gain
        span = settings.canary_window - (since - ready_at)
        verdict = judge_evidence(
            mine, baseline, since=since, baseline_since=baseline_since, latencies=latencies,
            ratio=1 - gain if gain is not None else 1 + settings.max_latency_regression,
            max_throughput_drop=drop, alpha=settings.canary_alpha,
            looks=max(1, math.ceil(span / settings.canary_look)))
        if verdict.verdict == "wait" and now - ready_at < settings.canary_window:
            return Step(plan.model_copy(update={"canary_verdict": _record(verdict)}))
    if verdict is None or verdict.verdict == "wait":
        # The window has run without the evidence deciding: its p99s against the baseline's decide, as a
        # fixed-window judge would.
        verdict = judge_canary(mine, baseline, settings.max_latency_regression, drop, latencies,
                               min_latency_gain=judge.min_latency_gain)
    plan = plan.model_copy(update={"canary_verdict": _record(verdict)})
    if verdict.verdict == "wait":
        if now - ready_at < settings.canary_window + settings.deadline:
            return Step(plan)
        # Readings stopped coming (an agent gone quiet): an unproven change does not stay.
        plan = plan.model_copy(update={"done": [key], "phase": "rolled_back", "batch": {}})
        waited = (settings.canary_window + settings.deadline).total_seconds()
        return Step(plan, [_back(action, plan, key)], (
            ActionState.ROLLED_BACK,
            f"the canary could not be judged within {waited:g}s of its READY ({verdict.reason}); "
            f"{key} {_undo(action)}"))
    if verdict.verdict == "fail":
        plan = plan.model_copy(update={"done": [key], "phase": "rolled_back", "batch": {}})
        return Step(plan, [_back(action, plan, key)], (ActionState.ROLLED_BACK,
                                                       f"{verdict.reason}; {key} {_undo(action)}"))
    if isinstance(action, SetLiveCapPayload):
        # Nothing leaves rotation: every peer whose plug-in is active takes the cap at once.
        takers = sorted(p.key for p in peers if _live(p) and action.needs(_asked(p)))
        queue = [takers] if takers else []
    else:
        queue = [[p.key] for p in sorted(peers, key=lambda r: r.key) if action.needs(p.engine_args, p.gpus)]
    return Step(plan.model_copy(update={"done": [key], "phase": "rolling", "batch": {}, "queue": queue}))


def _record(verdict: CanaryVerdict) -> CanaryVerdictRecord:
    return CanaryVerdictRecord(verdict=verdict.verdict, reason=verdict.reason, figures=verdict.figures)


def _live(view: ReplicaView) -> bool:
    return view.live_limits is not None and view.live_limits.active


def _asked(view: ReplicaView) -> int | None:
    return None if view.live_limits is None else view.live_limits.asked


def _back(action: CanaryPayload, plan: RolloutPlan, key: str) -> DesiredWrite:
    """What a canary taken back gets: the cap it had, or the arguments it ran before."""
    if isinstance(action, SetLiveCapPayload):
        return DesiredWrite(key, None, live=True, live_cap=action.previous)
    return DesiredWrite(key, list(plan.previous_args or []))


def _undo(action: CanaryPayload) -> str:
    if isinstance(action, SetLiveCapPayload):
        return f"rolled back to {cap_words(action.previous)}"
    if isinstance(action, MaxNumSeqsPayload):
        return f"rolled back to {action.governed} {action.previous}"
    return f"rolled back to its arguments without {action.change}"


def step(action: RolloutPayload, plan: RolloutPlan, model: str | None, observed: Observed, now: datetime,
         settings: RolloutSettings) -> Step:
    """One step of a running rollout: the next plan, the desired-state writes, and the verdict once it is over."""
    live = isinstance(action, SetLiveCapPayload)
    if plan.batch:
        pending = []
        for key, generation in plan.batch.items():
            view = observed.replicas.get(key)
            if isinstance(action, SetLiveCapPayload):
                where, why = cap_progress(key, None if view is None else view.state,
                                          None if view is None else view.live_limits, action.live_cap)
                if where == "fatal":
                    return Step(plan, verdict=(ActionState.FAILED, why or f"{key} cannot take a live cap"))
            else:
                where = progress(view, generation)
                if where == "fatal":
                    return Step(plan, verdict=(ActionState.FAILED, fatal_reason(key, view)))
            if where == "pending":
                pending.append(key)
        if pending:
            started = plan.batch_started_at or now
            if now - started > settings.deadline:
                return Step(plan, verdict=(ActionState.FAILED, f"deadline of {settings.deadline.total_seconds():g}s "
                                           f"passed; waiting on {', '.join(pending)}"))
            # One that left READY while settling settles again once it is back.
            return Step(plan.model_copy(update={"batch_ready_at": None, "waiting": None}) if plan.batch_ready_at
                        else plan)
        # A live cap takes nothing out of rotation: there is no health check to wait for.
        if plan.phase != "canary" and settings.settle > timedelta(0) and not live:
            ready_at = plan.batch_ready_at or now
            if now - ready_at < settings.settle:
                held = (now - ready_at).total_seconds()
                return Step(plan.model_copy(update={
                    "batch_ready_at": ready_at,
                    "waiting": f"settling: {', '.join(plan.batch)} READY for {held:.0f} of "
                               f"{settings.settle.total_seconds():g}s"}))
        if plan.phase == "canary":
            assert not isinstance(action, RollingRestartPayload)  # a rolling restart has no canary
            judged = _judge(action, plan, observed, now, settings)
            if judged.verdict is not None or judged.plan.phase == "canary":
                return judged
            plan = judged.plan
        else:
            plan = plan.model_copy(update={"done": [*plan.done, *plan.batch], "batch": {}, "batch_ready_at": None,
                                           "waiting": None})
    if not plan.queue:
        if isinstance(action, SetLiveCapPayload):
            return Step(plan, verdict=(ActionState.SUCCEEDED, f"{len(plan.done)} replica(s) at "
                                       f"{cap_words(action.live_cap)} with no restart: {', '.join(plan.done)}"))
        return Step(plan, verdict=(ActionState.SUCCEEDED, f"{len(plan.done)} replica(s) READY at their new "
                                   f"generation: {', '.join(plan.done)}"))
    waiting = None if live else _budget_wait(model, plan.queue[0], observed, settings.guard)
    if waiting is not None:
        return Step(plan.model_copy(update={"waiting": waiting}))
    return _start_batch(action, plan.model_copy(update={"queue": plan.queue[1:]}), plan.queue[0], observed, now)
