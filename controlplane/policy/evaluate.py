"""``evaluate(policies, snapshot, now)``: every action the policies propose for the fleet now. Pure.

Detectors find problems in replicas' or GPUs' histories, or read Alertmanager's alerts; each finding becomes
actions on the right target (a GPU finding restarts the replicas on that GPU, a replica finding cordons the
replica's node, an alert on a node restarts the replicas on it ...).
Guardrails are applied afterwards, by ``guardrails.decide``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.policy.actions import (
    AlertAction,
    CordonAction,
    LowerMaxNumSeqsAction,
    PlannedRestartAction,
    RestartAction,
    RollingRestartAction,
)
from controlplane.policy.conditions import (
    AlertCondition,
    Condition,
    CrashLoopCondition,
    EccCondition,
    ErrorRateCondition,
    LeakCondition,
    NodeUnreachableCondition,
    OomCrashCondition,
    StallCondition,
    ThermalCondition,
    ThresholdCondition,
    XidCondition,
)
from controlplane.policy.detectors.alert import detect_alert
from controlplane.policy.detectors.crash import detect_crash_loop, detect_oom_crash
from controlplane.policy.detectors.ecc import detect_ecc
from controlplane.policy.detectors.findings import Finding
from controlplane.policy.detectors.leak import detect_leak
from controlplane.policy.detectors.node import dark, detect_model_short, detect_node_unreachable
from controlplane.policy.detectors.slo import detect_error_rate, detect_threshold
from controlplane.policy.detectors.stall import detect_stall
from controlplane.policy.detectors.thermal import detect_thermal
from controlplane.policy.detectors.xid import detect_xid
from controlplane.policy.governor import govern_model
from controlplane.policy.memory import KeptReadings
from controlplane.policy.payloads import (
    AlertPayload,
    CordonPayload,
    Payload,
    PlannedRestartPayload,
    RestartPayload,
    RollingRestartPayload,
)
from controlplane.policy.policy import Policy, Scope
from controlplane.policy.proposals import ProposedAction, Target, replica_target
from controlplane.policy.shards import Part, judged_by_nodes
from controlplane.policy.snapshot import FleetSnapshot, Gpu, Node, Replica, split_key

GPU_CONDITIONS = (ThermalCondition, XidCondition, EccCondition)


def in_scope_replicas(policy: Policy, snapshot: FleetSnapshot) -> list[Replica]:
    scope = policy.scope
    if scope.everything:
        return list(snapshot.replicas)  # no replica matched one by one (13 policies, 8,000 replicas, each round)
    return list(_selected(scope, snapshot))


def _selected(scope: Scope, snapshot: FleetSnapshot) -> list[Replica]:
    """The replicas a selecting scope holds, worked out once per snapshot for every policy of that scope, each node
    and model name matched once (a thousand nodes and a few models, not 8,000 replicas, by glob)."""

    def build() -> list[Replica]:
        nodes: dict[str, bool] = {}
        models: dict[str, bool] = {}
        out = []
        for r in snapshot.replicas:
            node_ok = nodes.get(r.node)
            if node_ok is None:
                node_ok = nodes[r.node] = scope.matches_node(r.node)
            model_ok = models.get(r.model)
            if model_ok is None:
                model_ok = models[r.model] = scope.matches_model(r.model)
            if node_ok and model_ok and scope.matches_labels(r.labels):
                out.append(r)
        return out

    return snapshot.memo(("replicas", scope.key), build)


def in_scope_gpus(policy: Policy, snapshot: FleetSnapshot) -> list[Gpu]:
    """GPUs on in-scope nodes; with model or label selectors, only GPUs running a selected replica."""
    scope = policy.scope
    if scope.everything:
        return list(snapshot.gpus)

    def build() -> list[Gpu]:
        if not scope.by_replica:
            return [g for g in snapshot.gpus if scope.matches_node(g.node)]
        running = {(r.node, index) for r in _selected(scope, snapshot) for index in r.gpus}
        return [g for g in snapshot.gpus if (g.node, g.index) in running]

    return list(snapshot.memo(("gpus", scope.key), build))


def in_scope_keys(policy: Policy, snapshot: FleetSnapshot, gpus: bool) -> frozenset[str] | None:
    """The keys of the GPUs (``gpus``) or replicas a selecting scope holds (None: the scope is everything), worked
    out once per snapshot for all the policies with that scope."""
    scope = policy.scope
    if scope.everything:
        return None
    if gpus:
        return snapshot.memo(("gpu keys", scope.key), lambda: frozenset(g.key for g in in_scope_gpus(policy, snapshot)))
    return snapshot.memo(("replica keys", scope.key), lambda: frozenset(r.key for r in _selected(scope, snapshot)))


def in_scope_nodes(policy: Policy, snapshot: FleetSnapshot) -> list[Node]:
    """Nodes the scope names; with model or label selectors, only nodes running a selected replica."""
    scope = policy.scope

    def build() -> list[Node]:
        if not scope.by_replica:
            return [n for n in snapshot.nodes if scope.matches_node(n.name)]
        running = {r.node for r in _selected(scope, snapshot)}
        return [n for n in snapshot.nodes if n.name in running]

    return list(snapshot.memo(("nodes", scope.key), build))


def alert_target(key: str) -> Target | None:
    """The target an Alertmanager alert was mapped to (``replica:node/name``, ``node:name``, ``model:name``)."""
    kind, _, rest = key.partition(":")
    if kind == "replica":
        node, name = split_key(rest)
        return Target(kind="replica", node=node, replica=name) if node and name else None
    if kind == "node" and rest:
        return Target(kind="node", node=rest)
    if kind == "model" and rest:
        return Target(kind="model", model=rest)
    return None


def _alert_replicas(policy: Policy, target: Target, snapshot: FleetSnapshot) -> list[Replica]:
    """The in-scope replicas an alert's target covers: the replica, those on the node, or those of the model."""
    if target.kind == "replica":
        found = [r for r in snapshot.replicas_on(target.node or "") if r.name == target.replica]
    elif target.kind == "node":
        found = snapshot.replicas_on(target.node or "")
    else:
        found = snapshot.replicas_of_model(target.model or "")
    return [r for r in found if policy.scope.matches(r)]


def _alert_in_scope(policy: Policy, snapshot: FleetSnapshot, key: str) -> bool:
    """Whether the policy's scope covers an alert's target; a node with no replica counts when the scope
    selects by node only (a cordon needs no replica), as for GPUs."""
    target = alert_target(key)
    if target is None:
        return False
    if target.kind == "node":
        if snapshot.node(target.node or "") is None or not policy.scope.matches_node(target.node or ""):
            return False
        if not policy.scope.by_replica:
            return True
    return bool(_alert_replicas(policy, target, snapshot))


def detect(policy: Policy, snapshot: FleetSnapshot, now: datetime) -> list[Finding]:
    """Every finding of one policy's condition over its scope (governor policies use ``govern_model``)."""
    cond = policy.condition
    if isinstance(cond, AlertCondition):
        return detect_alert(cond, snapshot.external_alerts, lambda key: _alert_in_scope(policy, snapshot, key), now)
    if isinstance(cond, NodeUnreachableCondition):
        nodes = in_scope_nodes(policy, snapshot)
        gone = {n.name for n in snapshot.nodes if dark(cond, n, snapshot, now)}
        if not gone:
            return []  # the common round: every node heard from, no model to walk
        models = sorted({r.model for r in in_scope_replicas(policy, snapshot)})
        return ([f for n in nodes if (f := detect_node_unreachable(cond, n, snapshot, now, gone))]
                + [f for m in models if (f := detect_model_short(cond, m, snapshot, gone))])
    if isinstance(cond, GPU_CONDITIONS):
        return [f for g in in_scope_gpus(policy, snapshot) if (f := detect_gpu(cond, g, now))]
    return [f for r in in_scope_replicas(policy, snapshot) if (f := detect_replica(cond, r, snapshot, now))]


def detect_gpu(cond: Condition, gpu: Gpu, now: datetime) -> Finding | None:
    """One GPU's finding under a GPU condition (heat, XID, ECC)."""
    if isinstance(cond, ThermalCondition):
        return detect_thermal(cond, gpu, now)
    if isinstance(cond, EccCondition):
        return detect_ecc(cond, gpu, now)
    if isinstance(cond, XidCondition):
        return detect_xid(cond, gpu, now)
    return None


def detect_replica(cond: Condition, replica: Replica, snapshot: FleetSnapshot, now: datetime) -> Finding | None:
    """One replica's finding under a replica condition (latency and errors only while it serves)."""
    if isinstance(cond, ThresholdCondition):
        return detect_threshold(cond, replica, now) if replica.serving else None
    if isinstance(cond, ErrorRateCondition):
        return detect_error_rate(cond, replica, now) if replica.serving else None
    if isinstance(cond, StallCondition):
        return detect_stall(cond, replica, now)
    if isinstance(cond, LeakCondition):
        return detect_leak(cond, replica, snapshot, now) if replica.serving else None
    if isinstance(cond, CrashLoopCondition):
        return detect_crash_loop(cond, replica, now)
    if isinstance(cond, OomCrashCondition):
        return detect_oom_crash(cond, replica, now)
    return None


def _subject_replicas(policy: Policy, finding: Finding, snapshot: FleetSnapshot) -> list[Replica]:
    """The in-scope replicas a finding is about: the replica itself, or those on the GPU (or the alert's node
    or model)."""
    if isinstance(policy.condition, AlertCondition):
        target = alert_target(finding.subject)
        return [] if target is None else _alert_replicas(policy, target, snapshot)
    if isinstance(policy.condition, NodeUnreachableCondition):
        model = finding.subject.removeprefix("model:") if finding.subject.startswith("model:") else None
        on = snapshot.replicas_of_model(model) if model is not None else snapshot.replicas_on(finding.subject)
        return [r for r in on if policy.scope.matches(r)]
    node, rest = split_key(finding.subject)
    if isinstance(policy.condition, GPU_CONDITIONS):
        return [r for r in snapshot.replicas_on(node, int(rest)) if policy.scope.matches(r)]
    return [r for r in snapshot.replicas_on(node) if r.key == finding.subject]  # by its node: not a fleet scan


def _subject_target(policy: Policy, finding: Finding) -> Target:
    if isinstance(policy.condition, AlertCondition):
        target = alert_target(finding.subject)
        assert target is not None  # the detector finds only targets that parse
        return target
    if isinstance(policy.condition, NodeUnreachableCondition):
        if finding.subject.startswith("model:"):
            return Target(kind="model", model=finding.subject.removeprefix("model:"))
        return Target(kind="node", node=finding.subject)
    node, rest = split_key(finding.subject)
    if isinstance(policy.condition, GPU_CONDITIONS):
        return Target(kind="gpu", node=node, gpu=int(rest))
    return Target(kind="replica", node=node, replica=rest)


def actions_for(policy: Policy, findings: Sequence[Finding], snapshot: FleetSnapshot) -> list[ProposedAction]:
    """Turn one policy's findings into proposed actions on the right targets (plus its notify alerts)."""
    action = policy.action
    out: list[ProposedAction] = []

    def propose(payload: Payload, target: Target, finding: Finding, replicas: Sequence[Replica] = (),
                extra: str = "") -> None:
        # The model: of the replicas it disrupts, else of those it is about (an alert's, for its labels).
        models = {r.model for r in replicas or _subject_replicas(policy, finding, snapshot)}
        out.append(ProposedAction(
            policy=policy.name, target=target, payload=payload, replicas=[r.key for r in replicas],
            model=models.pop() if len(models) == 1 else None, reason=finding.summary + extra, findings=[finding],
            runbook_url=policy.runbook_url))

    rolled: set[str] = set()
    for finding in findings:
        replicas = _subject_replicas(policy, finding, snapshot)
        if isinstance(action, RestartAction | PlannedRestartAction):
            restart: Payload = (RestartPayload() if isinstance(action, RestartAction)
                                else PlannedRestartPayload(within_seconds=action.within))
            for r in replicas:
                target = replica_target(r)
                if not r.managed:
                    propose(AlertPayload(severity="warning"), target, finding,
                            extra=f": {r.key} is attached, not managed by Pitstop; restart it by hand")
                    continue
                propose(restart, target, finding, [r], f": {action.kind.replace('_', ' ')}")
        elif isinstance(action, RollingRestartAction):
            for model in sorted({r.model for r in replicas} - rolled):
                rolled.add(model)
                members = [r for r in snapshot.replicas_of_model(model) if policy.scope.matches(r) and r.managed]
                propose(RollingRestartPayload(batch_size=action.batch_size), Target(kind="model", model=model),
                        finding, members, f": rolling restart of {model}")
        elif isinstance(action, CordonAction):
            target = _subject_target(policy, finding)
            node = snapshot.node(target.node or "")
            if target.node is None:
                pass  # an alert on a model: no node to fence
            elif node is not None and (node.cordoned or (target.kind == "gpu" and target.gpu in node.cordoned_gpus)):
                pass  # already fenced: nothing to do but the notify below
            elif action.scope == "gpu" and target.kind == "gpu":
                propose(CordonPayload(kind="cordon", scope="gpu", gpu=target.gpu), target, finding,
                        extra=f": cordon GPU {target.gpu}")
            else:
                propose(CordonPayload(kind="cordon", scope="node"), Target(kind="node", node=target.node), finding,
                        extra=f": cordon node {target.node}")
        elif isinstance(action, AlertAction):
            propose(AlertPayload(severity=action.severity), _subject_target(policy, finding), finding)
        subject = _subject_target(policy, finding)
        already = any(a.kind == "alert" and a.target.key == subject.key and a.findings == [finding] for a in out)
        if policy.notify is not None and not already:
            propose(AlertPayload(severity=policy.notify.severity), subject, finding)
    return out


def evaluate_policy(policy: Policy, snapshot: FleetSnapshot, now: datetime,
                    kept: KeptReadings | None = None) -> list[ProposedAction]:
    """The actions one policy proposes now (``kept``: the governor's readings kept from earlier rounds)."""
    if not policy.enabled:
        return []
    if isinstance(policy.action, LowerMaxNumSeqsAction):
        assert isinstance(policy.condition, ThresholdCondition)  # the policy's validator guarantees it
        managed = [r for r in in_scope_replicas(policy, snapshot) if r.managed]
        out: list[ProposedAction] = []
        for model in sorted({r.model for r in managed}):
            out += govern_model(policy, policy.condition, policy.action,
                                [r for r in managed if r.model == model], now, snapshot.flag_trials, kept)
        return out
    return actions_for(policy, detect(policy, snapshot, now), snapshot)


def evaluate(policies: Sequence[Policy], snapshot: FleetSnapshot, now: datetime,
             part: Part | None = None) -> list[ProposedAction]:
    """Every action the policies propose for the fleet at ``now``, in policy order. Pure: no IO, no clock.

    ``part``: the shards this control plane holds (``controlplane.policy.shards``); None or whole: all of it."""
    if part is None or part.is_whole:
        return [a for p in policies for a in evaluate_policy(p, snapshot, now)]
    models = part.models_view(snapshot)
    return [a for p in part.policies(policies)
            for a in evaluate_policy(p, snapshot if judged_by_nodes(p) else models, now)]
