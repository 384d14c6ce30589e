"""A remediation policy: where it applies, when it fires, what it does and which guardrails hold it back."""

from __future__ import annotations

from fnmatch import fnmatchcase
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controlplane.policy.actions import Action, LowerMaxNumSeqsAction, Severity
from controlplane.policy.conditions import Condition, ThresholdCondition
from controlplane.policy.durations import Duration
from controlplane.policy.snapshot import Replica

POLICY_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"
# What actions and alerts not raised by a policy record as their policy (the breaker's
# page, Alertmanager's alerts, the notifier's own): a policy of that name would be mistaken for them.
RESERVED_NAMES = frozenset({"circuit-breaker", "alertmanager", "pitstop-notifier"})
# Signals the governor's proportional step can model: per-token decode latency, which grows with the batch.
BATCH_LATENCIES = frozenset({"itl_p50_seconds", "itl_p95_seconds", "itl_p99_seconds"})


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Scope(_Spec):
    """Selectors; glob patterns for models and nodes, exact values for labels. Empty selects everything."""

    models: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def everything(self) -> bool:
        """No selector: every replica, GPU and node is in scope (the shipped policies' scope)."""
        return not (self.models or self.nodes or self.labels)

    @property
    def by_replica(self) -> bool:
        """A model or label selector: a node or GPU is in scope only where a selected replica runs on it."""
        return bool(self.models or self.labels)

    @cached_property
    def key(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, str], ...]]:
        """The selectors as one hashable value: scopes that select alike have equal keys."""
        return tuple(self.models), tuple(self.nodes), tuple(sorted(self.labels.items()))

    def matches_node(self, node: str) -> bool:
        return not self.nodes or any(fnmatchcase(node, p) for p in self.nodes)

    def matches_model(self, model: str) -> bool:
        return not self.models or any(fnmatchcase(model, p) for p in self.models)

    def matches_labels(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels.items())

    def matches(self, replica: Replica) -> bool:
        return (self.matches_node(replica.node) and self.matches_model(replica.model)
                and self.matches_labels(replica.labels))


class Guardrails(_Spec):
    """Per-policy guardrails; the fleet-wide ones live in ``guardrails.GuardConfig``."""

    cooldown: Duration = Field(default=600.0, ge=0)
    dry_run: bool = False
    require_approval: bool = False
    max_disruptions_per_hour: int | None = Field(default=None, ge=0)


class Notify(_Spec):
    """Also raise an alert, carrying the evidence, whenever the policy's action is proposed."""

    severity: Severity = "page"


class Policy(_Spec):
    name: str = Field(pattern=POLICY_NAME)
    description: str = ""
    runbook_url: str | None = None
    enabled: bool = True
    scope: Scope = Field(default_factory=Scope)
    condition: Condition
    action: Action
    notify: Notify | None = None
    guardrails: Guardrails = Field(default_factory=Guardrails)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_NAMES:
            raise ValueError(f"{name!r} names Pitstop's own actions and alerts: choose another name")
        return name

    @model_validator(mode="after")
    def _governor_needs_an_upper_bound(self) -> Policy:
        # The governor lowers max-num-seqs when a latency-like signal is too HIGH; any other pairing is a typo.
        if isinstance(self.action, LowerMaxNumSeqsAction) and not (
            isinstance(self.condition, ThresholdCondition) and self.condition.op in (">", ">=")
        ):
            raise ValueError("action lower_max_num_seqs needs a threshold condition with op '>' or '>='")
        if (isinstance(self.action, LowerMaxNumSeqsAction) and self.action.step == "proportional"
                and isinstance(self.condition, ThresholdCondition) and self.condition.signal not in BATCH_LATENCIES):
            # The proportional model is "decode latency grows with the running batch": true of inter-token
            # latency, not of TTFT (queueing) or anything else.
            raise ValueError(f"step proportional models inter-token latency; use it with a condition on "
                             f"{', '.join(sorted(BATCH_LATENCIES))} (got {self.condition.signal}), or step ladder")
        return self
