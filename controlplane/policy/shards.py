"""``Part``: which share of the fleet a control plane's rounds judge, when rounds are spread. Pure.

The fleet splits into ``count`` model shards and one node shard (docs/design.md, "Spreading rounds"). A model
shard judges the replica conditions and the max-num-seqs governor for the models whose name hashes to it: a
model's replicas, canaries and governor state never depend on another model's. The node shard judges what is
about nodes and GPUs that several models share (heat, XIDs, ECC, silent nodes) and Alertmanager's alerts, on the
whole fleet. Every policy is judged by exactly one kind of shard, and every replica belongs to exactly one model
shard, so the parts that the control planes hold together propose what one whole round would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import (
    AlertCondition,
    EccCondition,
    NodeUnreachableCondition,
    ThermalCondition,
    XidCondition,
)
from controlplane.policy.policy import Policy
from controlplane.policy.snapshot import FleetSnapshot

_NODE_CONDITIONS = (AlertCondition, NodeUnreachableCondition, ThermalCondition, XidCondition, EccCondition)


def shard_of(model: str, count: int) -> int:
    """The model shard of a model: stable across processes, hosts and versions (a BLAKE2 digest of its name;
    not CRC-32, whose low bits barely differ between names like ``llama-1`` and ``llama-2``)."""
    return int.from_bytes(hashlib.blake2b(model.encode(), digest_size=8).digest(), "big") % count


def judged_by_nodes(policy: Policy) -> bool:
    """Whether the node shard judges a policy (else the model shards do, each for its own models)."""
    return isinstance(policy.condition, _NODE_CONDITIONS) and not isinstance(policy.action, LowerMaxNumSeqsAction)


@dataclass(frozen=True)
class Part:
    """The shards one control plane holds: indices ``0 .. count-1`` are model shards, ``count`` the node shard."""

    count: int
    held: frozenset[int]

    @classmethod
    def whole(cls, count: int = 1) -> Part:
        return cls(count=count, held=frozenset(range(count + 1)))

    @classmethod
    def of(cls, count: int, held: Iterable[int]) -> Part:
        return cls(count=count, held=frozenset(held))

    @property
    def is_whole(self) -> bool:
        return len(self.held) == self.count + 1

    @property
    def nodes(self) -> bool:
        return self.count in self.held

    def owns_model(self, model: str) -> bool:
        return shard_of(model, self.count) in self.held

    def judges(self, policy: Policy) -> bool:
        """Whether this part judges any of a policy's subjects."""
        return self.nodes if judged_by_nodes(policy) else any(i < self.count for i in self.held)

    def policies(self, policies: Sequence[Policy]) -> list[Policy]:
        return [p for p in policies if self.judges(p)]

    def models_view(self, snapshot: FleetSnapshot) -> FleetSnapshot:
        """The snapshot the model shards' policies read: the replicas of the models held, every node and GPU
        (a leak's limit is its host's or its GPUs' memory)."""
        if all(i in self.held for i in range(self.count)):
            return snapshot
        return snapshot.model_copy(update={"replicas": [r for r in snapshot.replicas if self.owns_model(r.model)]})

    def owns_alert(self, policy: Policy | None, labels: dict[str, object]) -> bool:
        """Whether a policy's firing alert is this part's to keep or resolve: the node shard's for its policies
        and for policies no longer loaded, else the model shard's of the alert's model."""
        if self.is_whole:
            return True
        if policy is None or judged_by_nodes(policy):
            return self.nodes
        model = labels.get("model")
        return self.owns_model(model) if isinstance(model, str) else self.nodes

    def describe(self) -> str:
        names = [f"model shard {i}" for i in sorted(self.held) if i < self.count]
        return ", ".join(names + (["the node shard"] if self.nodes else [])) or "nothing"
