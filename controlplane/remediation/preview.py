"""What an action would do if asked now: the guardrails' decision and its blast radius, with nothing recorded.

Pure. The console and ``pitstop … --dry-run`` show this before every click: which replicas the action takes out
of service at once, and how many of each model's READY replicas stay serving against the disruption budget's
floor. It counts READY the way the budget guardrail does (``guardrails.budget_check``): a replica already taken
by a running action, one an action brought back within the settle, or not READY, gives no capacity now.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel

from agent.wire import ReplicaState
from controlplane.policy.engine_args import MAX_NUM_SEQS
from controlplane.policy.guardrails import STATE_OF, Decision, GuardConfig, GuardState, Verdict, taken
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.payloads import CordonPayload, MaxNumSeqsPayload, RollingRestartPayload
from controlplane.policy.proposals import ProposedAction
from controlplane.policy.snapshot import FleetSnapshot, Replica


class ModelImpact(BaseModel):
    """One model the action touches."""

    model: str
    replicas: int
    # READY and not already taken by a running action.
    ready: int
    # Taken out of service at the same time (a rolling restart: one batch).
    out_at_once: int
    stay_serving: int
    # The disruption budget's floor for this model.
    floor: int


class ActionPreview(BaseModel):
    kind: str
    target: str
    verdict: Verdict
    guardrail: str | None = None
    reason: str = ""
    # The state the action would be recorded in; with ``force`` by an admin, a refusal becomes approved.
    state: ActionState
    forced: bool = False
    # Every replica it stops or restarts, over its whole course.
    replicas: list[str]
    impact: list[ModelImpact]
    summary: str


def affected(action: ProposedAction, snapshot: FleetSnapshot) -> list[Replica]:
    """The replicas the action stops or restarts over its whole course."""
    payload = action.payload
    if isinstance(payload, CordonPayload):
        if payload.kind == "uncordon":
            return []
        return snapshot.replicas_on(action.target.node or "", payload.gpu if payload.scope == "gpu" else None)
    keys = set(action.replicas)
    return [r for r in snapshot.replicas if r.key in keys]


def _at_once(action: ProposedAction, replicas: Sequence[Replica]) -> list[Replica]:
    if isinstance(action.payload, RollingRestartPayload):
        return list(replicas[: action.payload.batch_size])
    return list(replicas)


def blast_radius(action: ProposedAction, snapshot: FleetSnapshot, state: GuardState,
                 config: GuardConfig, now: datetime) -> list[ModelImpact]:
    hit = affected(action, snapshot)
    busy = taken(state, config, now)
    at_once = {r.key for r in _at_once(action, hit)}
    impact = []
    for model in sorted({r.model for r in hit}):
        members = snapshot.replicas_of_model(model)
        ready = {r.key for r in members if r.ready and r.state == ReplicaState.READY} - busy
        impact.append(ModelImpact(model=model, replicas=len(members), ready=len(ready),
                                  out_at_once=len(ready & at_once), stay_serving=len(ready - at_once),
                                  floor=config.budget_for(model).floor(len(members))))
    return impact


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summarise(action: ProposedAction, impact: Sequence[ModelImpact], hit: int) -> str:
    """One line on-call reads before confirming: what stops, and what stays serving."""
    payload = action.payload
    if isinstance(payload, CordonPayload):
        where = f"GPU {payload.gpu} of {action.target.node}" if payload.scope == "gpu" else action.target.node
        if payload.kind == "uncordon":
            return f"gives {where} back to the scheduler; nothing stops"
        if not impact:
            return f"fences {where}; no replica runs there"
        each = "; ".join(f"{m.model}: {m.stay_serving} of {m.replicas} stay serving" for m in impact)
        return f"fences {where} and drains {_plural(hit, 'replica')} ({each})"
    if not impact:
        return f"{action.kind.replace('_', ' ')} of {action.target.key}: no replica to stop"
    m = impact[0]
    if isinstance(payload, RollingRestartPayload):
        return (f"restarts {_plural(hit, 'replica')} of {m.model}, {payload.batch_size} at a time; "
                f"{m.stay_serving} of {m.replicas} stay serving throughout")
    if isinstance(payload, MaxNumSeqsPayload) and payload.canary:
        return (f"tries {MAX_NUM_SEQS} {payload.max_num_seqs} (now {payload.previous}) on {action.replicas[0]} "
                f"first: restarts {m.out_at_once} of {m.ready} READY replicas of {m.model}, {m.stay_serving} stay "
                "serving; if it holds up beside its peers, it rolls to the others one at a time")
    verb = "drains" if action.kind == "drain" else "restarts"
    return f"{verb} {m.out_at_once} of {m.ready} READY replicas of {m.model}; {m.stay_serving} stay serving"


def preview(decision: Decision, snapshot: FleetSnapshot, state: GuardState, config: GuardConfig, *,
            force: bool, now: datetime) -> ActionPreview:
    action = decision.action
    impact = blast_radius(action, snapshot, state, config, now)
    hit = affected(action, snapshot)
    summary = summarise(action, impact, len(hit))
    recorded = STATE_OF[decision.verdict]
    forced = force and decision.verdict is not Verdict.ALLOWED
    if decision.verdict is Verdict.SUPPRESSED:
        held = f"held by the {(decision.guardrail or 'guardrails').replace('_', ' ')}: {decision.reason}"
        summary = f"{held}; with force it {summary}" if force else f"{held}; otherwise it {summary}"
    if forced:
        recorded = ActionState.APPROVED
    return ActionPreview(kind=action.kind, target=action.target.key, verdict=decision.verdict,
                         guardrail=decision.guardrail, reason=decision.reason, state=recorded, forced=forced,
                         replicas=[r.key for r in hit], impact=impact, summary=summary)
