"""One policy round on the leader: snapshot -> evaluate -> guardrails -> record (-> the executor applies).

Every decision is recorded so "why did Pitstop not act" has an answer: allowed actions as ``approved``,
dry-run ones as ``shadow``, held ones as ``suppressed`` (the first of a streak: a refusal that repeats every
round is one row, not one per round), approval-bound ones as ``proposed``. A proposal is dropped before the
guardrails when an action for the same policy, kind and target is still open, or when a disruptive one would
touch a replica another open action is already changing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.policy.due import dues
from controlplane.policy.evaluate import evaluate
from controlplane.policy.guardrails import Decision, GuardConfig, Verdict, decide
from controlplane.policy.incremental import Evaluator
from controlplane.policy.kinds import find
from controlplane.policy.lifecycle import OPEN, ActionState
from controlplane.policy.payloads import AlertPayload, PlannedRestartPayload
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.policy.shards import Part, judged_by_nodes
from controlplane.policy.signals import from_stored
from controlplane.policy.snapshot import split_key
from controlplane.remediation import alerting, breaker
from controlplane.remediation.alerting import raise_alert
from controlplane.remediation.history import SampleHistory
from controlplane.remediation.planning import plan_restart, restart_deadline
from controlplane.remediation.records import create, guard_state, hold_guardrails, record_decision
from controlplane.remediation.snapshot import FleetRows, build_snapshot
from controlplane.store.models import ActionRow
from controlplane.store.samples import subject_series

REQUESTED_BY = "policy"


@dataclass
class RoundResult:
    proposed: int = 0
    recorded: list[int] = field(default_factory=list)
    skipped_open: int = 0
    breaker_tripped: str | None = None
    resolved: list[int] = field(default_factory=list)
    # The next moment a condition under way completes its ``for:`` (``policy.due``): the next round's turn.
    next_due: datetime | None = None
    # Each such moment with the node it is on, soonest first: those that pass while the round runs get an urgent
    # round of their nodes after it (``rounds.PolicyRounds.run_urgent``).
    dues: list[tuple[datetime, str]] = field(default_factory=list)


@dataclass
class OpenActions:
    keys: set[tuple[str, str, str]] = field(default_factory=set)
    busy: set[str] = field(default_factory=set)  # replicas an approved or running action is changing
    governed: set[str] = field(default_factory=set)  # models with a max-num-seqs change (or canary) open

    def blocks(self, a: ProposedAction) -> bool:
        if (a.policy, a.kind, a.target.key) in self.keys:
            return True
        governed = a.spec.governed or (isinstance(a.payload, AlertPayload) and bool(a.payload.governed))
        if governed and a.model in self.governed:
            # One change in flight per model: a canary rolls its own value to the peers, and the governor's
            # "nothing left to try" waits until the change being judged has had its say.
            return True
        return a.disruptive and bool(self.busy & set(a.replicas))


def _open_actions(session: Session) -> OpenActions:
    found = OpenActions()
    for row in session.scalars(select(ActionRow).where(ActionRow.state.in_([s.value for s in OPEN]))):
        found.keys.add((row.policy or "operator", row.kind, row.target))
        if row.state != ActionState.PROPOSED and row.disruptive:
            found.busy.update(row.replicas)
        if (known := find(row.kind)) is not None and known.governed and row.model is not None:
            found.governed.add(row.model)
    return found


def _is_repeat_refusal(session: Session, decision: Decision) -> bool:
    a = decision.action
    last = session.scalars(select(ActionRow).where(ActionRow.policy == a.policy, ActionRow.kind == a.kind,
                                                   ActionRow.target == a.target.key)
                           .order_by(ActionRow.id.desc()).limit(1)).first()
    return (last is not None and last.state == ActionState.SUPPRESSED
            and bool(last.guardrails) and last.guardrails[0].get("guardrail") == decision.guardrail)


def request_rates(session: Session, key: str, since: datetime) -> list[tuple[datetime, float]]:
    """One replica's requests per second since ``since``, as (sample time, rate): the planned restart's forecast."""
    node, name = split_key(key)
    points = subject_series(session, node=node, kind="replica", subject=name, since=since)
    rates = [(at, from_stored(at, values).requests_per_second) for at, _width, values in points]
    return [(at, rate) for at, rate in rates if rate is not None]


def _scheduled(session: Session, a: ProposedAction, now: datetime) -> ProposedAction:
    """A planned restart with its time slot: the quietest forecast moment before its deadline."""
    if not isinstance(a.payload, PlannedRestartPayload) or not a.replicas:
        return a
    left = min((f.figure("seconds_to_limit", float("inf")) for f in a.findings), default=float("inf"))
    deadline = restart_deadline(now, a.payload.within_seconds, None if left == float("inf") else left)
    rates = request_rates(session, a.replicas[0], now - timedelta(days=1, hours=1) - (deadline - now))
    not_before, why = plan_restart(now, deadline, rates)
    return a.model_copy(update={"payload": a.payload.model_copy(
        update={"not_before": not_before, "deadline": deadline, "schedule": why})})


def _trip(session: Session, reason: str, now: datetime) -> None:
    if not breaker.trip(session=session, reason=reason, now=now):
        return
    page = ProposedAction(
        policy="circuit-breaker", target=Target(kind="node"), payload=AlertPayload(severity="page"),
        reason=f"circuit breaker tripped: {reason}; automation is stopped until an operator resets it")
    # Recorded as done at once: the page is the whole action, and it must not wait for the executor.
    row = create(session=session, proposal=page, state=ActionState.SUCCEEDED, now=now, requested_by=REQUESTED_BY,
                 policy="circuit-breaker", guardrails=[], target_kind="fleet", target="fleet",
                 outcome="alert recorded; delivery pending")
    raise_alert(session=session, action=row, payload=AlertPayload(severity="page"), now=now)


def run_round(*, session: Session, now: datetime, policies: list[Policy], guard_config: GuardConfig,
              history: timedelta, samples: SampleHistory | None = None,
              reports_since: datetime | None = None, evaluator: Evaluator | None = None,
              rows: FleetRows | None = None, part: Part | None = None,
              only: set[str] | None = None) -> RoundResult:
    """Evaluate every policy against the stored fleet and record the guarded decisions (``samples``: the
    leader's history cache, read incrementally; ``reports_since``: when this control plane began to hear
    reports, before which no node's silence counts; ``evaluator``: the rounds' incremental evaluation, which
    proposes what ``evaluate`` would, judging again only the subjects whose answer may have changed; ``rows``:
    the leader's copy of the latest rows, read again only for the nodes that reported; ``part``: the shards this
    control plane holds, None for the whole fleet; ``only``: read what is new of these nodes alone, the rest as
    the last round read it, ``build_snapshot``).

    Deciding and recording hold the guardrails' lock (``hold_guardrails``): control planes that hold other shards
    decide one after another, each counting what the others recorded."""
    result = RoundResult()
    snapshot = build_snapshot(session=session, now=now, history=history, samples=samples, rows=rows, only=only)
    models = Counter(r.model for r in snapshot.replicas)
    snapshot = snapshot.model_copy(update={
        "reports_since": reports_since,
        "ready_floors": {m: guard_config.budget_for(m).floor(n) for m, n in models.items()}})
    part = part or Part.whole()
    proposed = (evaluate(policies, snapshot, now, part) if evaluator is None
                else evaluator.evaluate(policies, snapshot, now, part))
    result.proposed = len(proposed)
    result.dues = dues([p for p in part.policies(policies) if not judged_by_nodes(p)], part.models_view(snapshot), now)
    if part.nodes:
        result.dues = sorted(result.dues + dues([p for p in policies if judged_by_nodes(p)], snapshot, now))
    result.next_due = result.dues[0][0] if result.dues else None
    by_name = {p.name: p for p in policies}
    # Alerts the policies still propose hold; the ones they stopped proposing resolve once clear long enough.
    result.resolved = alerting.sync(session=session, proposals=proposed, snapshot=snapshot, policies=by_name,
                                    now=now, owns=part.owns_alert)
    if not proposed:
        return result
    hold_guardrails(session)
    still_open = _open_actions(session)
    fresh = []
    for a in proposed:
        if still_open.blocks(a):
            result.skipped_open += 1
            continue
        fresh.append(a)
    if not fresh:
        return result
    window = timedelta(seconds=max(3600.0, guard_config.breaker_window, guard_config.rate_window))
    state = breaker.with_breaker(guard_state(session=session, now=now, window=window),
                                 breaker.read(session=session))
    guarded = decide(fresh, state, snapshot, now, by_name, guard_config)
    if guarded.breaker_trip is not None:
        _trip(session, guarded.breaker_trip, now)
        result.breaker_tripped = guarded.breaker_trip
    for decision in guarded.decisions:
        if decision.verdict is Verdict.SUPPRESSED and _is_repeat_refusal(session, decision):
            continue
        a = decision.action
        decision = decision.model_copy(update={"action": _scheduled(session, a, now)})
        row = record_decision(session=session, decision=decision, now=now, requested_by=REQUESTED_BY,
                              policy=a.policy)
        result.recorded.append(row.id)
    return result
