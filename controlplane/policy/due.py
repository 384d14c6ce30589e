"""``next_due(policies, snapshot, now)``: the next moment a condition under way completes its ``for:``; ``dues``:
each such moment with the node it is on. Pure.

``for:`` counts from the first sample that crossed (its report's time), so a breach that goes on is met at an
exact moment known in advance: the first crossing plus ``for:``. The rounds wake then (``wait_seconds``) instead
of acting at whichever report or interval comes next, which cost up to a report interval, the debounce and
the policy process's wake-up past the ``for:``. Only conditions whose moment can be told are counted:
thresholds in every sample, heat, a WEDGED replica's stall, a silent node; the others keep the rounds' usual
pace.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import (
    NodeUnreachableCondition,
    StallCondition,
    ThermalCondition,
    ThresholdCondition,
)
from controlplane.policy.detectors.node import node_unreachable_due
from controlplane.policy.detectors.slo import threshold_due
from controlplane.policy.detectors.stall import stall_due
from controlplane.policy.detectors.thermal import thermal_due
from controlplane.policy.evaluate import in_scope_gpus, in_scope_nodes, in_scope_replicas
from controlplane.policy.policy import Policy
from controlplane.policy.screens import screen
from controlplane.policy.snapshot import FleetSnapshot

# Past the moment, not on it: a round that reads its clock a hair early finds nothing, and waits again.
DUE_SLACK_SECONDS = 0.01


def policy_dues(policy: Policy, snapshot: FleetSnapshot, now: datetime) -> list[tuple[datetime, str]]:
    """The moments one policy's condition is met on its subjects if what holds now goes on holding, each with the
    node of its subject (a replica's, a GPU's, or the node itself)."""
    cond = policy.condition
    if not policy.enabled or isinstance(policy.action, LowerMaxNumSeqsAction):
        return []  # the governor judges its own windows
    found: list[tuple[datetime | None, str]] = []
    # A screened subject has nothing under way either: its newest reading does not cross (``screens``).
    calm = screen(cond, now) or _never
    if isinstance(cond, ThresholdCondition):
        found = [(threshold_due(cond, r, now), r.node) for r in in_scope_replicas(policy, snapshot) if not calm(r)]
    elif isinstance(cond, ThermalCondition):
        found = [(thermal_due(cond, g, now), g.node) for g in in_scope_gpus(policy, snapshot) if not calm(g)]
    elif isinstance(cond, StallCondition):
        found = [(stall_due(cond, r, now), r.node) for r in in_scope_replicas(policy, snapshot)]
    elif isinstance(cond, NodeUnreachableCondition):
        found = [(node_unreachable_due(cond, n, snapshot, now), n.name) for n in in_scope_nodes(policy, snapshot)]
    return [(d, node) for d, node in found if d is not None]


def policy_due(policy: Policy, snapshot: FleetSnapshot, now: datetime) -> datetime | None:
    """The next moment one policy's condition is met on some subject if what holds now goes on holding."""
    return min((d for d, _ in policy_dues(policy, snapshot, now)), default=None)


def _never(subject: object) -> bool:
    return False


def dues(policies: Sequence[Policy], snapshot: FleetSnapshot, now: datetime) -> list[tuple[datetime, str]]:
    """Every moment, after ``now``, that a condition under way is met, with the node it is on, soonest first."""
    return sorted(due for p in policies for due in policy_dues(p, snapshot, now))


def next_due(policies: Sequence[Policy], snapshot: FleetSnapshot, now: datetime) -> datetime | None:
    """The soonest moment, after ``now``, that a condition under way is met (None: none under way)."""
    return min((d for p in policies if (d := policy_due(p, snapshot, now)) is not None), default=None)


def wait_seconds(due: datetime | None, now: datetime, interval: float) -> float:
    """How long the rounds wait for their next turn: the interval, or less when a condition is due sooner (at
    once when the round that saw it ran past its moment)."""
    if due is None:
        return interval
    return min(interval, max(0.0, (due - now).total_seconds() + DUE_SLACK_SECONDS))
