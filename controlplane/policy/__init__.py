"""Pitstop's remediation policy engine: pure decisions over a fleet snapshot, no IO.

``parse_policies`` reads policy text, ``evaluate`` proposes actions, ``decide`` applies the guardrails and
``explain`` does both for a report. ``controlplane.policy_files`` reads the policy files, the control plane
builds the ``FleetSnapshot`` from its store and an executor applies the allowed actions.
"""

from controlplane.policy.evaluate import evaluate
from controlplane.policy.explain import ExplainReport, explain
from controlplane.policy.guardrails import ActionRecord, Decision, GuardConfig, GuardState, Verdict, decide
from controlplane.policy.loader import PolicyError, PolicyLoadError, parse_policies
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.policy.snapshot import FleetSnapshot, Gpu, GpuReading, Node, Replica, ReplicaSample

__all__ = [
    "ActionRecord", "Decision", "ExplainReport", "FleetSnapshot", "Gpu", "GpuReading", "GuardConfig", "GuardState",
    "Node", "Policy", "PolicyError", "PolicyLoadError", "ProposedAction", "Replica", "ReplicaSample", "Target",
    "Verdict", "decide", "evaluate", "explain", "parse_policies",
]
