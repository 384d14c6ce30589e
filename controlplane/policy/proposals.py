"""What ``evaluate`` returns: a proposed action with its target, parameters, reason and evidence."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.policy.detectors.findings import Finding
from controlplane.policy.snapshot import Replica

ActionKind = Literal[
    "restart", "rolling_restart", "planned_restart", "lower_max_num_seqs", "raise_max_num_seqs", "add_engine_flag",
    "cordon", "alert",
]
# Kinds that take capacity away (a restart drains a replica; a cordon fences a node).
DISRUPTIVE: frozenset[str] = frozenset(
    {"restart", "rolling_restart", "planned_restart", "lower_max_num_seqs", "raise_max_num_seqs", "add_engine_flag",
     "cordon"}
)
# Kinds that stop replicas and so count against a model's disruption budget.
STOPS_REPLICAS: frozenset[str] = DISRUPTIVE - {"cordon"}


class Target(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["replica", "model", "gpu", "node"]
    node: str | None = None
    replica: str | None = None
    model: str | None = None
    gpu: int | None = None

    @property
    def key(self) -> str:
        """Stable text key, e.g. ``replica:node-a/r1``, ``model:llama-8b``, ``gpu:node-a/3``, ``node:node-a``."""
        if self.kind == "replica":
            return f"replica:{self.node}/{self.replica}"
        if self.kind == "model":
            return f"model:{self.model}"
        if self.kind == "gpu":
            return f"gpu:{self.node}/{self.gpu}"
        return f"node:{self.node}"


class ProposedAction(BaseModel):
    model_config = ConfigDict(frozen=True)

    policy: str
    kind: ActionKind
    target: Target
    params: dict[str, Any] = Field(default_factory=dict)
    # Replicas ("node/replica") the action would stop or restart, and their model (for the disruption budget).
    replicas: list[str] = Field(default_factory=list)
    model: str | None = None
    reason: str
    findings: list[Finding] = Field(default_factory=list)
    runbook_url: str | None = None

    @property
    def disruptive(self) -> bool:
        return self.kind in DISRUPTIVE

    @property
    def stops_replicas(self) -> bool:
        return self.kind in STOPS_REPLICAS


def replica_target(replica: Replica) -> Target:
    """The target of an action on one replica."""
    return Target(kind="replica", node=replica.node, replica=replica.name, model=replica.model)
