"""An operator's request to act (restart, drain, set engine flags, cordon, uncordon) as an action record.

The request goes through the same guardrails as an automatic action (``guardrails.decide``), as the
pseudo-policy ``operator`` with the default per-policy guardrails, each kind as itself (``policy.kinds``): it
counts against the disruption budget, the fleet rate limit and the breaker, and later actions count it. An
admin may pass ``force`` to bypass a refusal; the bypass is kept in the action's guardrail decisions and in the
audit log.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from sqlalchemy.orm import Session

from controlplane.policy.guardrails import Decision, GuardConfig, Verdict, decide
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.payloads import CordonPayload, DrainPayload, Payload, RestartPayload, SetFlagsPayload
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation.records import guard_state, record_decision, state_for
from controlplane.remediation.snapshot import build_snapshot
from controlplane.store.models import ActionRow, Node, Replica

OPERATOR_POLICY = "operator"
# Guardrails need the model's replicas and their readiness, not their histories.
_NO_HISTORY = timedelta(0)


class ReplicaActionRequest(BaseModel):
    kind: Literal["restart", "drain", "set_flags"]
    # set_flags: the full argument list the engine restarts with.
    engine_args: list[str] | None = Field(default=None, max_length=256)
    reason: str = Field(default="", max_length=2000)
    force: bool = False

    @model_validator(mode="after")
    def _flags_given(self) -> ReplicaActionRequest:
        if (self.kind == "set_flags") != (self.engine_args is not None):
            raise ValueError("engine_args is required for set_flags and only for set_flags")
        return self


class NodeActionRequest(BaseModel):
    kind: Literal["cordon", "uncordon"]
    # Cordon (or uncordon) this one GPU of the node: only the replicas using it drain; omitted, the whole node.
    gpu: int | None = Field(default=None, ge=0, le=1023)
    reason: str = Field(default="", max_length=2000)
    force: bool = False


class NotFound(LookupError):
    pass


def _decide(session: Session, proposal: ProposedAction, now: datetime, config: GuardConfig,
            model: str | None) -> Decision:
    snapshot = build_snapshot(session=session, now=now, history=_NO_HISTORY, model=model or "")
    return decide([proposal], guard_state(session=session, now=now), snapshot, now, {}, config).decisions[0]


def _store(session: Session, decision: Decision, who: str, force: bool, now: datetime) -> ActionRow:
    state = state_for(decision)
    if force and decision.verdict is not Verdict.ALLOWED:
        decision = decision.model_copy(update={"reason": f"{decision.reason} (bypassed by {who} with force)"})
        state = ActionState.APPROVED
    # An operator's own request is its approval; guardrails may still hold it back.
    return record_decision(session=session, decision=decision, now=now, requested_by=who, state=state,
                           approved_by=who)


def propose_replica_action(*, session: Session, node: str, name: str, request: ReplicaActionRequest,
                           who: str, now: datetime, config: GuardConfig | None = None) -> ActionRow:
    replica = session.get(Replica, (node, name))
    if replica is None:
        raise NotFound(f"no replica {name!r} on node {node!r}")
    key = f"{node}/{name}"
    payload: Payload
    if request.kind == "set_flags":
        assert request.engine_args is not None  # the request's validator guarantees it
        payload = SetFlagsPayload(engine_args={key: list(request.engine_args)})
    else:
        payload = DrainPayload() if request.kind == "drain" else RestartPayload()
    proposal = ProposedAction(
        policy=OPERATOR_POLICY, target=Target(kind="replica", node=node, replica=name, model=replica.model),
        payload=payload, replicas=[key], model=replica.model,
        reason=request.reason or f"{request.kind} requested by {who}",
    )
    decision = _decide(session, proposal, now, config or GuardConfig(), replica.model)
    return _store(session, decision, who, request.force, now)


def propose_node_action(*, session: Session, node: str, request: NodeActionRequest, who: str, now: datetime,
                        config: GuardConfig | None = None) -> ActionRow:
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
    proposal = ProposedAction(policy=OPERATOR_POLICY, target=target, payload=payload,
                              reason=request.reason or f"{what} requested by {who}")
    decision = _decide(session, proposal, now, config or GuardConfig(), None)
    return _store(session, decision, who, request.force, now)
