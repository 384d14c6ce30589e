"""What ``evaluate`` returns: a proposed action with its target, typed payload, reason and evidence."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from controlplane.policy.detectors.findings import Finding
from controlplane.policy.kinds import KindSpec, spec
from controlplane.policy.payloads import Payload, parse_payload, payload_json
from controlplane.policy.snapshot import Replica


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
    """A proposed action. Built with ``payload`` (a model of ``payloads``); ``kind`` with an optional ``params``
    mapping is validated into the kind's payload, so a proposal can never carry a shape its kind lacks."""

    model_config = ConfigDict(frozen=True)

    policy: str
    target: Target
    # Serialised as ``kind`` and ``params`` (the payload's JSON form), the shape a row and the API have.
    payload: Payload = Field(exclude=True)
    # Replicas ("node/replica") the action would stop or restart, and their model (for the disruption budget).
    replicas: list[str] = Field(default_factory=list)
    model: str | None = None
    reason: str
    findings: list[Finding] = Field(default_factory=list)
    runbook_url: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _payload_from_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kind" in data:
            data = dict(data)
            kind, params = data.pop("kind"), data.pop("params", None)
            if "payload" not in data:
                data["payload"] = parse_payload(str(kind), params or {})
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def kind(self) -> str:
        return self.payload.kind

    @property
    def spec(self) -> KindSpec:
        return spec(self.payload.kind)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def params(self) -> dict[str, Any]:
        """The payload's JSON form, as stored and served (for reading; the payload is the typed value)."""
        return payload_json(self.payload)

    @property
    def disruptive(self) -> bool:
        return self.spec.disrupts

    @property
    def stops_replicas(self) -> bool:
        return self.spec.stops_replicas


def replica_target(replica: Replica) -> Target:
    """The target of an action on one replica."""
    return Target(kind="replica", node=replica.node, replica=replica.name, model=replica.model)
