"""An operator's request to act (restart, drain, set engine flags or a live cap, cordon, uncordon, a model's
rolling restart) as an action record, or, with ``dry_run``, a preview of what the guardrails would decide and
its blast radius (``remediation.preview``), with nothing recorded.

The request goes through the same guardrails as an automatic action (``guardrails.decide``), as the
pseudo-policy ``operator`` with the default per-policy guardrails, each kind as itself (``policy.kinds``): it
counts against the disruption budget, the fleet rate limit and the breaker, and later actions count it. An
admin may pass ``force`` to bypass a refusal; the bypass is kept in the action's guardrail decisions and in the
audit log.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.policy.engine_args import governed_limit
from controlplane.policy.guardrails import Decision, GuardConfig, Verdict, decide
from controlplane.policy.kinds import KINDS, ActionKind
from controlplane.policy.lifecycle import OPEN, ActionState
from controlplane.policy.live_cap import above_startup, asked_limit, reported, takes, unavailable
from controlplane.policy.payloads import (
    CordonPayload,
    DrainPayload,
    Judge,
    MaxNumSeqsPayload,
    Payload,
    RestartPayload,
    RollingRestartPayload,
    SetFlagsPayload,
    SetLiveCapPayload,
    governed_flag,
)
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation.preview import ActionPreview, preview
from controlplane.remediation.records import guard_state, record_decision, state_for
from controlplane.remediation.snapshot import build_snapshot
from controlplane.store.models import ActionRow, Node, Replica
from engines import adapter

OPERATOR_POLICY = "operator"
# How much throughput an operator's lowering may cost its canary against the peers (the shipped itl-slo's).
OPERATOR_MAX_THROUGHPUT_DROP = 0.35
# Guardrails need the model's replicas and their readiness, not their histories.
_NO_HISTORY = timedelta(0)


class ReplicaActionRequest(BaseModel):
    kind: Literal["restart", "drain", "set_flags", "set_live_cap"]
    # set_flags: the full argument list the engine restarts with.
    engine_args: list[str] | None = Field(default=None, max_length=256)
    # set_live_cap: the most requests the engine runs at once, from its next step, with no restart (its
    # startup --max-num-seqs at most); null lifts the cap. Only for a replica with live limits active.
    live_cap: int | None = Field(default=None, ge=1, le=65536)
    reason: str = Field(default="", max_length=2000)
    force: bool = False

    @model_validator(mode="after")
    def _flags_given(self) -> ReplicaActionRequest:
        if (self.kind == "set_flags") != (self.engine_args is not None):
            raise ValueError("engine_args is required for set_flags and only for set_flags")
        # Given as null is a value (lift the cap): what was sent decides, not what it holds.
        if (self.kind == "set_live_cap") != ("live_cap" in self.model_fields_set):
            raise ValueError("live_cap (a number, or null to lift the cap) is required for set_live_cap and only "
                             "for set_live_cap")
        return self


class NodeActionRequest(BaseModel):
    kind: Literal["cordon", "uncordon"]
    # Cordon (or uncordon) this one GPU of the node: only the replicas using it drain; omitted, the whole node.
    gpu: int | None = Field(default=None, ge=0, le=1023)
    reason: str = Field(default="", max_length=2000)
    force: bool = False


class ModelActionRequest(BaseModel):
    kind: Literal["rolling_restart", "set_max_num_seqs"]
    # rolling_restart: replicas restarted at a time; the rollout starts the next batch only within the model's
    # disruption budget.
    batch_size: int = Field(default=1, ge=1, le=1024)
    # set_max_num_seqs: the value, tried on one replica (a canary: ``canary``, or the first READY one) and judged
    # beside its peers before it rolls to the model's other replicas, as the governor's own changes are.
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    canary: str | None = Field(default=None, max_length=300, pattern=r"^[^/]+/[^/]+$")
    reason: str = Field(default="", max_length=2000)
    force: bool = False

    @model_validator(mode="after")
    def _value_given(self) -> ModelActionRequest:
        if (self.kind == "set_max_num_seqs") != (self.max_num_seqs is not None):
            raise ValueError("max_num_seqs is required for set_max_num_seqs and only for set_max_num_seqs")
        return self

    @property
    def checked_kind(self) -> str:
        """The kind whose row of the table says who may ask (lower and raise need the same role)."""
        return "lower_max_num_seqs" if self.kind == "set_max_num_seqs" else self.kind


# (session, now, guardrails, dry run) -> the recorded row, or the preview: what an API handler runs.
Act = Callable[[Session, datetime, GuardConfig, bool], "ActionRow | ActionPreview"]


class NotFound(LookupError):
    pass


class Conflict(RuntimeError):
    """The same action on the same target is already open: a second one would fight the first."""


def _store(session: Session, decision: Decision, who: str, force: bool, now: datetime) -> ActionRow:
    state = state_for(decision)
    if force and decision.verdict is not Verdict.ALLOWED:
        decision = decision.model_copy(update={"reason": f"{decision.reason} (bypassed by {who} with force)"})
        state = ActionState.APPROVED
    # An operator's own request is its approval; guardrails may still hold it back.
    return record_decision(session=session, decision=decision, now=now, requested_by=who, state=state,
                           approved_by=who)


def _act(session: Session, proposal: ProposedAction, who: str, force: bool, now: datetime,
         config: GuardConfig | None, dry_run: bool) -> ActionRow | ActionPreview:
    config = config or GuardConfig()
    # The guardrails need only the model's replicas (a fence is judged by no budget); a fence's blast radius
    # needs every replica of its node or GPU, whatever their model.
    fence = proposal.target.kind in ("node", "gpu")
    model = (None if dry_run else "") if fence else (proposal.model or "")
    snapshot = build_snapshot(session=session, now=now, history=_NO_HISTORY, model=model)
    state = guard_state(session=session, now=now)
    decision = decide([proposal], state, snapshot, now, {}, config).decisions[0]
    if dry_run:
        return preview(decision, snapshot, state, config, force=force, now=now)
    return _store(session, decision, who, force, now)


def replica_proposal(*, session: Session, node: str, name: str, request: ReplicaActionRequest,
                     who: str) -> ProposedAction:
    replica = session.get(Replica, (node, name))
    if replica is None:
        raise NotFound(f"no replica {name!r} on node {node!r}")
    key = f"{node}/{name}"
    payload: Payload
    if request.kind == "set_flags":
        assert request.engine_args is not None  # the request's validator guarantees it
        payload = SetFlagsPayload(engine_args={key: list(request.engine_args)})
    elif request.kind == "set_live_cap":
        payload = _live_cap_payload(session, replica, key, request.live_cap)
    else:
        payload = DrainPayload() if request.kind == "drain" else RestartPayload()
    return ProposedAction(
        policy=OPERATOR_POLICY, target=Target(kind="replica", node=node, replica=name, model=replica.model),
        payload=payload, replicas=[key], model=replica.model,
        reason=request.reason or f"{request.kind} requested by {who}",
    )


def _live_cap_payload(session: Session, replica: Replica, key: str, cap: int | None) -> SetLiveCapPayload:
    """A live cap for one replica whose plug-in is active, within its startup limit; one change of the model's
    concurrency at a time, as the governor's own."""
    limits = reported(replica.live_limits)
    problem = unavailable(key, limits)
    if problem is None:
        assert limits is not None
        problem = above_startup(key, limits, cap)
    if problem is not None:
        raise Conflict(problem)
    assert limits is not None
    if cap == limits.asked:
        raise Conflict(f"{key} already has {'no live cap' if cap is None else f'a live cap of {cap}'}: nothing to "
                       "change")
    _governed_open(session, replica.model)
    return SetLiveCapPayload(live_cap=cap, previous=limits.asked)


def _governed_open(session: Session, model: str) -> None:
    """One change of a model's engine flags at a time: the governor's own rule, for operators too."""
    kinds = [k.value for k, row in KINDS.items() if row.governed]
    open_row = session.scalars(select(ActionRow).where(
        ActionRow.model == model, ActionRow.kind.in_(kinds),
        ActionRow.state.in_([s.value for s in OPEN])).order_by(ActionRow.id).limit(1)).first()
    if open_row is not None:
        raise Conflict(f"a {open_row.kind.replace('_', ' ')} of {model} is already {open_row.state} "
                       f"(action {open_row.id}): one change of a model's flags at a time")


def _max_num_seqs_proposal(session: Session, model: str, request: ModelActionRequest, who: str,
                           rows: list[Replica]) -> ProposedAction:
    assert request.max_num_seqs is not None  # the request's validator guarantees it
    _governed_open(session, model)
    if request.canary is not None:
        canary = next((r for r in rows if f"{r.node}/{r.name}" == request.canary), None)
        if canary is None:
            raise NotFound(f"no managed replica {request.canary!r} of model {model!r}")
    else:
        canary = next((r for r in rows if r.ready and r.state == "READY"), rows[0])
    key = f"{canary.node}/{canary.name}"
    args = [str(a) for a in canary.engine_args]
    value = request.max_num_seqs
    live = {f"{r.node}/{r.name}": reported(r.live_limits) for r in rows}
    # Every replica's plug-in active and the value within each engine's startup limit: a live cap, no restart.
    if all(takes(limits, value) for limits in live.values()):
        limits = live[key]
        current = asked_limit(limits)
        assert limits is not None and current is not None
        if value == current:
            raise Conflict(f"{key} already runs at most {value} requests at once (its live cap): nothing to change")
        judge = Judge(latencies=["itl_p99_seconds"],
                      max_throughput_drop=OPERATOR_MAX_THROUGHPUT_DROP if value < current else None)
        return ProposedAction(
            policy=OPERATOR_POLICY, target=Target(kind="replica", node=canary.node, replica=canary.name, model=model),
            payload=SetLiveCapPayload(live_cap=value, previous=limits.asked, canary=True, judge=judge),
            replicas=[key], model=model,
            reason=request.reason or (f"running requests {current} -> {value} on {model} as a live cap (no restart), "
                                      f"canary {key} first, requested by {who}"))
    engine = adapter(canary.engine_kind)
    flag = engine.governed_flag
    current = governed_limit(args) or engine.governed_default
    if current is None:
        raise Conflict(f"{key} runs {engine.title} with no {flag}: the engine works its limit out itself, so there "
                       f"is no current value to change from; start it with {flag} first")
    if value == current:
        raise Conflict(f"{key} already runs {flag} {value}: nothing to change")
    lower = value < current
    change = MaxNumSeqsPayload(
        kind=ActionKind.LOWER_MAX_NUM_SEQS if lower else ActionKind.RAISE_MAX_NUM_SEQS, max_num_seqs=value,
        previous=current, canary=True, flag=governed_flag(engine),
        # Judged as the governor judges its own: inter-token latency against the peers, and (lowering) how much
        # throughput the smaller batch may cost. TTFT is not judged: it rises by design when the batch shrinks.
        judge=Judge(latencies=["itl_p99_seconds"], max_throughput_drop=OPERATOR_MAX_THROUGHPUT_DROP if lower else None))
    return ProposedAction(
        policy=OPERATOR_POLICY, target=Target(kind="replica", node=canary.node, replica=canary.name, model=model),
        payload=change.model_copy(update={"engine_args": {key: change.derive(args)}}), replicas=[key], model=model,
        reason=request.reason or (f"{flag} {current} -> {value} on {model}, canary {key} first, "
                                  f"requested by {who}"))


def model_proposal(*, session: Session, model: str, request: ModelActionRequest, who: str) -> ProposedAction:
    """A rolling restart of every managed replica of ``model``, in the order the store lists them, or a
    ``--max-num-seqs`` change tried on a canary first."""
    if request.kind == "set_max_num_seqs":
        managed = [r for r in session.scalars(select(Replica).where(Replica.model == model)
                                              .order_by(Replica.node, Replica.name)) if r.managed]
        if not managed:
            raise NotFound(f"no managed replica serves model {model!r}")
        return _max_num_seqs_proposal(session, model, request, who, managed)
    rows = session.execute(select(Replica.node, Replica.name, Replica.managed).where(Replica.model == model)
                           .order_by(Replica.node, Replica.name)).all()
    if not rows:
        raise NotFound(f"no replica serves model {model!r}")
    members = [f"{node}/{name}" for node, name, managed in rows if managed]
    if not members:
        raise NotFound(f"no replica of model {model!r} is managed by Pitstop: attached engines restart by hand")
    target = Target(kind="model", model=model)
    open_row = session.scalars(select(ActionRow).where(
        ActionRow.kind == request.kind, ActionRow.target == target.key,
        ActionRow.state.in_([s.value for s in OPEN])).order_by(ActionRow.id).limit(1)).first()
    if open_row is not None:
        raise Conflict(f"a {request.kind.replace('_', ' ')} of {model} is already {open_row.state} "
                       f"(action {open_row.id})")
    return ProposedAction(policy=OPERATOR_POLICY, target=target,
                          payload=RollingRestartPayload(batch_size=request.batch_size), replicas=members,
                          model=model, reason=request.reason or f"rolling restart of {model} requested by {who}")


def node_proposal(*, session: Session, node: str, request: NodeActionRequest, who: str) -> ProposedAction:
    if session.get(Node, node) is None:
        raise NotFound(f"no node named {node!r}")
    # Policies never propose an uncordon: giving a fenced GPU or node back is an operator's call, and the
    # table of kinds holds it back by no capacity guardrail.
    if request.gpu is None:
        target, payload = Target(kind="node", node=node), CordonPayload(kind=request.kind, scope="node")
    else:
        target = Target(kind="gpu", node=node, gpu=request.gpu)
        payload = CordonPayload(kind=request.kind, scope="gpu", gpu=request.gpu)
    what = request.kind if request.gpu is None else f"{request.kind} of GPU {request.gpu}"
    return ProposedAction(policy=OPERATOR_POLICY, target=target, payload=payload,
                          reason=request.reason or f"{what} requested by {who}")


def act_on_replica(*, session: Session, node: str, name: str, request: ReplicaActionRequest, who: str,
                   now: datetime, config: GuardConfig | None = None,
                   dry_run: bool = False) -> ActionRow | ActionPreview:
    proposal = replica_proposal(session=session, node=node, name=name, request=request, who=who)
    return _act(session, proposal, who, request.force, now, config, dry_run)


def act_on_model(*, session: Session, model: str, request: ModelActionRequest, who: str, now: datetime,
                 config: GuardConfig | None = None, dry_run: bool = False) -> ActionRow | ActionPreview:
    proposal = model_proposal(session=session, model=model, request=request, who=who)
    return _act(session, proposal, who, request.force, now, config, dry_run)


def act_on_node(*, session: Session, node: str, request: NodeActionRequest, who: str, now: datetime,
                config: GuardConfig | None = None, dry_run: bool = False) -> ActionRow | ActionPreview:
    proposal = node_proposal(session=session, node=node, request=request, who=who)
    return _act(session, proposal, who, request.force, now, config, dry_run)


def propose_replica_action(*, session: Session, node: str, name: str, request: ReplicaActionRequest,
                           who: str, now: datetime, config: GuardConfig | None = None) -> ActionRow:
    row = act_on_replica(session=session, node=node, name=name, request=request, who=who, now=now, config=config)
    assert isinstance(row, ActionRow)
    return row


def propose_node_action(*, session: Session, node: str, request: NodeActionRequest, who: str, now: datetime,
                        config: GuardConfig | None = None) -> ActionRow:
    row = act_on_node(session=session, node=node, request=request, who=who, now=now, config=config)
    assert isinstance(row, ActionRow)
    return row


def propose_model_action(*, session: Session, model: str, request: ModelActionRequest, who: str, now: datetime,
                         config: GuardConfig | None = None) -> ActionRow:
    row = act_on_model(session=session, model=model, request=request, who=who, now=now, config=config)
    assert isinstance(row, ActionRow)
    return row
