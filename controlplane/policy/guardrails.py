"""Guardrails: pure filters that decide which proposed actions may run now.

``decide(actions, state, snapshot, now, policies, config)`` returns one decision per action — allowed,
suppressed (with the guardrail's name and reason), shadow (dry-run) or awaiting approval. The guard state
(recent actions with their outcomes, the breaker) is an input value; the executor stores the next one.
Alerts are never held back by capacity guardrails: the page must go out even when automation is stopped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from fnmatch import fnmatchcase

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from agent.wire import ReplicaState
from controlplane.policy.durations import Duration
from controlplane.policy.kinds import Guardrail
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.payloads import RollingRestartPayload
from controlplane.policy.policy import Guardrails, Policy
from controlplane.policy.proposals import ProposedAction
from controlplane.policy.snapshot import FleetSnapshot

S = ActionState
# Approved and not yet finished: takes capacity now (for the disruption budget).
IN_FLIGHT: frozenset[ActionState] = frozenset({S.APPROVED, S.RUNNING})
# Went wrong: counts towards the breaker.
WENT_WRONG: frozenset[ActionState] = frozenset({S.FAILED, S.ROLLED_BACK})
# Took capacity (or tried to): counts for rate limits and the breaker.
EXECUTED: frozenset[ActionState] = IN_FLIGHT | WENT_WRONG | {S.SUCCEEDED}
# Ran on its replicas and ended (not held back, rejected or shadowed): they may have just come back.
ENDED_ON_REPLICAS: frozenset[ActionState] = EXECUTED - IN_FLIGHT


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActionRecord(_Frozen):
    """One past decision the executor recorded, with its outcome so far."""

    policy: str
    kind: str
    target: str  # Target.key
    at: AwareDatetime
    status: ActionState
    replicas: list[str] = Field(default_factory=list)
    model: str | None = None
    disruptive: bool = True
    # When it reached its outcome (the control plane's clock): a restart's replica is back READY then, and a
    # load balancer puts it in rotation only ``GuardConfig.settle`` later.
    finished_at: AwareDatetime | None = None


class GuardState(_Frozen):
    records: list[ActionRecord] = Field(default_factory=list)
    breaker_tripped_at: AwareDatetime | None = None
    breaker_reason: str | None = None
    # An operator's reset: what failed or disrupted before it no longer counts towards a new trip.
    breaker_reset_at: AwareDatetime | None = None


class BudgetRule(_Frozen):
    min_ready: int = Field(default=1, ge=0)
    min_ready_ratio: float = Field(default=0.5, ge=0, le=1)

    def floor(self, replicas: int) -> int:
        """How many of a model's ``replicas`` must stay READY: the one budget floor, for guardrails and rollouts."""
        return max(self.min_ready, math.ceil(self.min_ready_ratio * replicas))


class GuardConfig(_Frozen):
    """Fleet-wide guardrails (per-policy ones are in the policy's ``guardrails``)."""

    budget: BudgetRule = Field(default_factory=BudgetRule)
    # Per-model overrides, keyed by a glob over model names.
    model_budgets: dict[str, BudgetRule] = Field(default_factory=dict)
    rate_window: Duration = 3600.0
    max_disruptive_per_window: int = Field(default=20, ge=0)
    breaker_window: Duration = 3600.0
    breaker_max_failures: int = Field(default=3, ge=1)
    breaker_max_disrupted_replicas: int = Field(default=30, ge=1)
    # A replica an action brought back gives capacity only this long after the action ended: READY to the agent
    # is not yet in rotation behind a load balancer (HAProxy: ``inter`` times ``rise``, 4 s with its defaults).
    # The server sets it from ``rollout_settle_seconds`` unless ``guardrails.settle`` is given.
    settle: Duration = 5.0

    def budget_for(self, model: str) -> BudgetRule:
        return next((r for pattern, r in self.model_budgets.items() if fnmatchcase(model, pattern)), self.budget)


class Verdict(StrEnum):
    ALLOWED = "allowed"
    SUPPRESSED = "suppressed"
    SHADOW = "shadow"
    AWAITING_APPROVAL = "awaiting_approval"


class Decision(_Frozen):
    action: ProposedAction
    verdict: Verdict
    guardrail: str | None = None
    reason: str = ""


class GuardResult(_Frozen):
    decisions: list[Decision]
    # Set when the breaker trips in this evaluation; the executor stores it in the next GuardState and pages.
    breaker_trip: str | None = None


def breaker_check(state: GuardState, config: GuardConfig, now: datetime) -> str | None:
    """Why automation must stop fleet-wide, or None: tripped earlier and not reset, or too much went wrong."""
    if state.breaker_tripped_at is not None:
        return f"tripped at {state.breaker_tripped_at.isoformat()}: {state.breaker_reason or 'no reason recorded'}"
    since = now - timedelta(seconds=config.breaker_window)
    if state.breaker_reset_at is not None:
        since = max(since, state.breaker_reset_at)
    recent = [r for r in state.records if r.at >= since]
    failures = sum(1 for r in recent if r.status in WENT_WRONG)
    if failures >= config.breaker_max_failures:
        return f"{failures} failed actions within {config.breaker_window:g}s (limit {config.breaker_max_failures})"
    disrupted = {k for r in recent if r.status in EXECUTED and r.disruptive for k in r.replicas}
    if len(disrupted) >= config.breaker_max_disrupted_replicas:
        return (f"{len(disrupted)} replicas disrupted within {config.breaker_window:g}s "
                f"(limit {config.breaker_max_disrupted_replicas})")
    return None


def cooldown_check(action: ProposedAction, guard: Guardrails, state: GuardState, batch: Sequence[ProposedAction],
                   now: datetime) -> str | None:
    """Suppress a repeat of (policy, target) within the policy's cooldown, or twice in one evaluation."""
    key = action.target.key
    if any(a.policy == action.policy and a.target.key == key and a.kind == action.kind for a in batch):
        return f"already decided for {key} in this evaluation"
    since = now - timedelta(seconds=guard.cooldown)
    last = [r for r in state.records if r.policy == action.policy and r.target == key and r.at >= since
            and r.status != S.SUPPRESSED and r.kind == action.kind]
    if last:
        return f"{action.policy} acted on {key} at {last[-1].at.isoformat()} ({last[-1].status}); cooldown " \
               f"{guard.cooldown:g}s"
    return None


def policy_rate_check(action: ProposedAction, guard: Guardrails, state: GuardState,
                      allowed: Sequence[ProposedAction], now: datetime) -> str | None:
    if guard.max_disruptions_per_hour is None:
        return None
    since = now - timedelta(hours=1)
    used = sum(1 for r in state.records if r.policy == action.policy and r.disruptive and r.status in EXECUTED
               and r.at >= since) + sum(1 for a in allowed if a.policy == action.policy and a.disruptive)
    if used >= guard.max_disruptions_per_hour:
        return f"{action.policy} already disrupted {used} time(s) this hour (limit {guard.max_disruptions_per_hour})"
    return None


def global_rate_check(config: GuardConfig, state: GuardState, allowed: Sequence[ProposedAction],
                      now: datetime) -> str | None:
    since = now - timedelta(seconds=config.rate_window)
    used = sum(1 for r in state.records if r.disruptive and r.status in EXECUTED and r.at >= since)
    used += sum(1 for a in allowed if a.disruptive)
    if used >= config.max_disruptive_per_window:
        return (f"{used} disruptive actions within {config.rate_window:g}s "
                f"(fleet limit {config.max_disruptive_per_window})")
    return None


def _stopped_at_once(action: ProposedAction) -> list[str]:
    """Replicas the action takes down at the same time (model-wide actions go one batch at a time)."""
    if isinstance(action.payload, RollingRestartPayload):
        return action.replicas[: action.payload.batch_size]
    if action.target.kind == "model":
        return action.replicas[:1]
    return list(action.replicas)


def settling(state: GuardState, config: GuardConfig, now: datetime) -> set[str]:
    """Replicas an action ended on within ``config.settle``: READY again, maybe not yet back in rotation."""
    since = now - timedelta(seconds=config.settle)
    return {k for r in state.records if r.disruptive and r.status in ENDED_ON_REPLICAS and r.finished_at is not None
            and r.finished_at > since for k in r.replicas}


def _running_on(state: GuardState) -> set[str]:
    return {k for r in state.records if r.status in IN_FLIGHT for k in r.replicas}


def taken(state: GuardState, config: GuardConfig, now: datetime) -> set[str]:
    """Replicas that give no capacity now whatever their state: a running action's, and those still settling."""
    return _running_on(state) | settling(state, config, now)


def budget_check(action: ProposedAction, config: GuardConfig, state: GuardState, snapshot: FleetSnapshot,
                 allowed: Sequence[ProposedAction], now: datetime) -> str | None:
    """Keep at least max(min_ready, ceil(ratio * replicas)) of the model READY, counting running actions.

    A replica that is already not READY, or is wedged (a stall finding), gives no capacity to protect: restarting
    it is always within budget, even for a model's only replica. One an action brought back READY counts only
    ``config.settle`` after that action ended (``settling``).
    """
    if not action.stops_replicas or action.model is None:
        return None
    members = snapshot.replicas_of_model(action.model)
    floor = config.budget_for(action.model).floor(len(members))
    back = settling(state, config, now)
    busy = _running_on(state) | back | {k for a in allowed if a.stops_replicas for k in _stopped_at_once(a)}
    wedged = {f.subject for f in action.findings if f.detector == "stall"}
    ready = {r.key for r in members if r.ready and r.state == ReplicaState.READY}
    available = ready - busy - wedged
    after = available - set(_stopped_at_once(action))
    if len(after) < floor and after != available:  # an action that takes no capacity away never breaks it
        why = (f"{action.model}: {len(after)} of {len(members)} replicas would stay READY, budget needs {floor} "
               f"({len(available)} available now")
        if held := sorted((ready & back) - wedged):
            why += f"; {', '.join(held)} back within the last {config.settle:g}s, not yet counted"
        return why + ")"
    return None


def decide(actions: Sequence[ProposedAction], state: GuardState, snapshot: FleetSnapshot, now: datetime,
           policies: Mapping[str, Policy], config: GuardConfig | None = None) -> GuardResult:
    """One decision per proposed action, in order; allowed actions consume budgets for the ones after them."""
    config = config or GuardConfig()
    breaker = breaker_check(state, config, now)
    tripped_now = breaker if breaker and state.breaker_tripped_at is None else None
    decisions: list[Decision] = []
    seen: list[ProposedAction] = []
    allowed: list[ProposedAction] = []
    for action in actions:
        policy = policies.get(action.policy)
        guard = policy.guardrails if policy else Guardrails()
        # The kind's row of the table says which guardrails judge it, in this order.
        applies = action.spec.guardrails
        checks: list[tuple[str, str | None]] = []
        for g in Guardrail:
            if g not in applies:
                continue
            if g is Guardrail.CIRCUIT_BREAKER:
                why = breaker
            elif g is Guardrail.COOLDOWN:
                why = cooldown_check(action, guard, state, seen, now)
            elif g is Guardrail.POLICY_RATE_LIMIT:
                why = policy_rate_check(action, guard, state, allowed, now)
            elif g is Guardrail.RATE_LIMIT:
                why = global_rate_check(config, state, allowed, now)
            else:
                why = budget_check(action, config, state, snapshot, allowed, now)
            checks.append((g.value, why))
        seen.append(action)
        blocked = next(((name, why) for name, why in checks if why is not None), None)
        if blocked is not None:
            decisions.append(Decision(action=action, verdict=Verdict.SUPPRESSED, guardrail=blocked[0],
                                      reason=blocked[1] or ""))
        elif guard.dry_run:
            decisions.append(Decision(action=action, verdict=Verdict.SHADOW, guardrail="dry_run",
                                      reason="policy runs in dry-run: recorded, not applied"))
        elif guard.require_approval and action.disruptive:
            decisions.append(Decision(action=action, verdict=Verdict.AWAITING_APPROVAL, guardrail="approval",
                                      reason="policy requires approval: proposed, waiting for an operator"))
        else:
            allowed.append(action)
            decisions.append(Decision(action=action, verdict=Verdict.ALLOWED))
    return GuardResult(decisions=decisions, breaker_trip=tripped_now)


STATE_OF: dict[Verdict, ActionState] = {
    Verdict.ALLOWED: S.APPROVED, Verdict.SUPPRESSED: S.SUPPRESSED, Verdict.SHADOW: S.SHADOW,
    Verdict.AWAITING_APPROVAL: S.PROPOSED,
}


def record(decision: Decision, now: datetime) -> ActionRecord:
    """The record the executor stores for a decision (before applying it; it updates the status after)."""
    status = STATE_OF[decision.verdict]
    a = decision.action
    return ActionRecord(policy=a.policy, kind=a.kind, target=a.target.key, at=now, status=status,
                        replicas=list(a.replicas), model=a.model, disruptive=a.disruptive)
