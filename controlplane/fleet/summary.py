"""The fleet at a glance, per model: SLO status against the policies' targets, replicas by state, throughput.

Pure. ``summarise`` takes the figures it reads of each replica (``ReplicaFigures``: a few scalars, not the whole
``ReplicaOut``, so a fleet of thousands is summed in milliseconds) and the loaded policies and returns what
the console's Fleet page and ``pitstop status`` show first. The SLO targets are the thresholds of the policies
that watch them (``ttft-slo``, ``itl-slo``, ``error-rate`` as shipped, or whatever policies an operator loaded
on the same signals), so the colour on the page and the policy that acts agree. A model's latency is its
worst READY replica's p99 (on-call looks for the replica in trouble, not an average that hides it); its error
ratio is errors over requests summed over its replicas.

Status: ``red`` over the target, ``amber`` within ``AMBER_SHARE`` of it, ``green`` below, ``unknown`` with no
reading (an idle model has no ITL) or no policy to give a target. A model's own status is the worst of its
objectives and of its capacity: ``amber`` while some replica is not serving (wedged, restarting, on a silent
node), ``red`` when none is; the SLOs of the replicas still serving can look fine while one is down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from controlplane.fleet.schemas import NodeStatus
from controlplane.policy.conditions import ErrorRateCondition, ThresholdCondition
from controlplane.policy.policy import Policy
from engines import ADAPTERS, DEFAULT_ENGINE, adapter

Status = Literal["green", "amber", "red", "unknown"]
# Above this share of the target a reading is amber: close enough to the line to look at.
AMBER_SHARE = 0.8
_RANK: dict[Status, int] = {"unknown": 0, "green": 1, "amber": 2, "red": 3}
# (objective, the replica signal it reads) for the latency SLOs.
LATENCY_OBJECTIVES = (("ttft_p99", "ttft_p99_seconds"), ("itl_p99", "itl_p99_seconds"))


class ReplicaFigures(NamedTuple):
    """What the summary reads of one replica. Its engine readings are kept as ``salvage`` keeps them for
    ``GET /v1/replicas``: None when unknown, or out of the wire's bounds (negative, infinite)."""

    model: str
    state: str
    ready: bool
    node_status: NodeStatus
    has_engine: bool  # the agent sent an engine sample at all (a replica still starting has none)
    ttft_p99_seconds: float | None = None
    itl_p99_seconds: float | None = None
    requests_per_second: float | None = None
    errors_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    engine: str = DEFAULT_ENGINE  # the engine it runs (``engines/``)


# The engine readings ``ReplicaFigures`` carries, by their ``EngineSample`` names.
FIGURES = ("ttft_p99_seconds", "itl_p99_seconds", "requests_per_second", "errors_per_second",
           "generation_tokens_per_second")


class Objective(BaseModel):
    name: str
    value: float | None
    target: float | None
    # The policy whose threshold is the target: what acts when the status turns red.
    policy: str | None
    status: Status


class ModelSummary(BaseModel):
    model: str
    # The engines its replicas run (one, as a rule), and the flag that caps their running requests: what an
    # operator's running-limit change sets.
    engines: list[str] = Field(default_factory=list)
    governed_flag: str | None = None
    replicas: int
    ready: int
    by_state: dict[str, int]
    tokens_per_second: float | None
    requests_per_second: float | None
    objectives: list[Objective]
    # Serving against replicas: amber with one down, red with none serving.
    capacity: Status
    # The worst of its objectives and its capacity.
    status: Status


def status_of(value: float | None, target: float | None) -> Status:
    if value is None or target is None:
        return "unknown"
    if value > target:
        return "red"
    return "amber" if value > AMBER_SHARE * target else "green"


def capacity_of(ready: int, replicas: int) -> Status:
    if replicas == 0:
        return "unknown"
    return "green" if ready == replicas else "red" if ready == 0 else "amber"


def worst(statuses: Sequence[Status]) -> Status:
    return max(statuses, key=lambda s: _RANK[s], default="unknown")


def _applies(policy: Policy, model: str) -> bool:
    return policy.enabled and (not policy.scope.models or any(fnmatchcase(model, p) for p in policy.scope.models))


def latency_target(policies: Sequence[Policy], model: str, signal: str) -> tuple[float | None, str | None]:
    """The lowest upper bound any enabled policy of ``model`` puts on ``signal``: the line it acts on."""
    bounds = [(p.condition.threshold, p.name) for p in policies if _applies(p, model)
              and isinstance(p.condition, ThresholdCondition) and p.condition.signal == signal
              and p.condition.op in (">", ">=")]
    return min(bounds, default=(None, None))


def error_target(policies: Sequence[Policy], model: str) -> tuple[float | None, str | None]:
    bounds = [(p.condition.threshold, p.name) for p in policies if _applies(p, model)
              and isinstance(p.condition, ErrorRateCondition)]
    return min(bounds, default=(None, None))


def _sum(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def serving(r: ReplicaFigures) -> bool:
    """READY as its agent last said, and that agent is still reporting (a stale node's word is old news)."""
    return r.ready and r.state == "READY" and r.node_status == NodeStatus.UP


def summarise_model(model: str, replicas: Sequence[ReplicaFigures], policies: Sequence[Policy]) -> ModelSummary:
    up = [r for r in replicas if serving(r) and r.has_engine]
    objectives = []
    for name, signal in LATENCY_OBJECTIVES:
        readings = [v for r in up if (v := getattr(r, signal)) is not None]
        target, policy = latency_target(policies, model, signal)
        value = max(readings) if readings else None
        objectives.append(Objective(name=name, value=value, target=target, policy=policy,
                                    status=status_of(value, target)))
    requests = _sum([r.requests_per_second for r in up])
    errors = _sum([r.errors_per_second for r in up])
    ratio = errors / requests if errors is not None and requests else None
    target, policy = error_target(policies, model)
    objectives.append(Objective(name="error_ratio", value=ratio, target=target, policy=policy,
                                status=status_of(ratio, target)))
    ready = sum(1 for r in replicas if serving(r))
    capacity = capacity_of(ready, len(replicas))
    engines = sorted({r.engine for r in replicas})
    flags = {adapter(e).governed_flag for e in engines if e in ADAPTERS}
    return ModelSummary(
        model=model, engines=engines, governed_flag=next(iter(flags)) if len(flags) == 1 else None,
        replicas=len(replicas), ready=ready,
        by_state=dict(sorted(Counter(r.state for r in replicas).items())),
        tokens_per_second=_sum([r.generation_tokens_per_second for r in up]),
        requests_per_second=requests, objectives=objectives, capacity=capacity,
        status=worst([o.status for o in objectives] + [capacity]))


def summarise(replicas: Sequence[ReplicaFigures], policies: Sequence[Policy]) -> list[ModelSummary]:
    by_model: dict[str, list[ReplicaFigures]] = {}
    for r in replicas:
        by_model.setdefault(r.model, []).append(r)
    return [summarise_model(m, rs, policies) for m, rs in sorted(by_model.items())]
