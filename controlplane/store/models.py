"""The fleet's tables: SQLAlchemy 2 typed declarative models (storage only; the API speaks pydantic)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class UtcDateTime(TypeDecorator[datetime]):
    """Stores naive UTC, returns aware UTC: SQLite keeps no zone, and comparing naive to aware times raises."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UtcDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class Node(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(64))
    agent_url: Mapped[str | None] = mapped_column(String(512))
    first_seen_at: Mapped[datetime]
    last_report_at: Mapped[datetime]  # control-plane clock: staleness never depends on the agent's clock
    last_sent_at: Mapped[datetime]  # agent clock, only compared with itself (sequence resets)
    last_sequence: Mapped[int] = mapped_column(BigInteger)
    reports_total: Mapped[int] = mapped_column(default=0)
    status: Mapped[str] = mapped_column(String(16), default="up")
    cordoned: Mapped[bool] = mapped_column(default=False)
    # GPU indices cordoned on their own (None: none). Here, not on ``gpus``: those rows are replaced per report.
    cordoned_gpus: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    # The host's memory as the agent reported it: the limit a leaking engine's RSS is projected against.
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)


class Gpu(Base):
    __tablename__ = "gpus"

    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime]
    # The latest GpuSample as sent (temperatures, memory, utilisation, power, throttle reasons, XIDs).
    readings: Mapped[dict[str, Any]]


class Replica(Base):
    __tablename__ = "replicas"

    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(256))
    url: Mapped[str] = mapped_column(String(512))
    managed: Mapped[bool]
    state: Mapped[str] = mapped_column(String(16))
    ready: Mapped[bool]
    generation: Mapped[int]
    gpus: Mapped[list[Any]]
    engine_args: Mapped[list[Any]]
    restarts_total: Mapped[int]
    state_since: Mapped[datetime]
    last_exit_code: Mapped[int | None]
    log_tail: Mapped[list[Any]]
    engine: Mapped[dict[str, Any] | None]
    process: Mapped[dict[str, Any] | None]
    canary_ttft_seconds: Mapped[float | None]
    canary_ok: Mapped[bool | None]
    # The live-cap plug-in as the agent last reported it (``agent.wire.LiveLimits``); None: live limits off,
    # or an agent that predates them.
    live_limits: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # The engine it runs (``engines/``); vLLM for agents that predate engine names.
    engine_kind: Mapped[str] = mapped_column(String(16), default="vllm", server_default="vllm")
    updated_at: Mapped[datetime]


class ReplicaEventRow(Base):
    __tablename__ = "replica_events"
    __table_args__ = (Index("ix_replica_events_node_replica_at", "node", "replica", "at"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(64))
    replica: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(index=True)
    received_at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(64))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")


class NodeSamples(Base):
    """One node's samples at one instant (a report's time, or a bucket's start): every replica's and GPU's
    readings, packed into one value (``store.packing``; docs/design.md, "The store")."""

    __tablename__ = "node_samples"
    __table_args__ = (Index("ix_node_samples_node_at", "node", "at"), Index("ix_node_samples_at", "at"))

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime]
    # 0 for raw points; otherwise the width of the bucket these points average.
    resolution_seconds: Mapped[int] = mapped_column(default=0)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class DesiredReplica(Base):
    """The operator's (or a rollout's) wish for one replica; answered to the agent as a ``ReplicaSpec``."""

    __tablename__ = "desired_replicas"
    __table_args__ = (UniqueConstraint("node", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(64))
    generation: Mapped[int] = mapped_column(default=0)
    engine_args: Mapped[list[Any]]
    enabled: Mapped[bool] = mapped_column(default=True)
    updated_at: Mapped[datetime]
    # The generation whose restart asks the agent for a stack dump of the engine it replaces (a stall's
    # restart); a later generation, written by anything else, no longer matches and asks for none.
    capture_stack_generation: Mapped[int | None] = mapped_column(default=None)
    # The live cap on running requests asked of the engine's plug-in (None: none); no generation of its own,
    # since it needs no restart.
    live_cap: Mapped[int | None] = mapped_column(default=None)


class ActionRow(Base):
    """One action, automatic or an operator's; its states and their transitions are ``policy.lifecycle``'s.

    ``params`` holds the kind's typed payload as JSON (``policy.payloads``). The state column is also the
    claim: the executor moves approved -> running with a WHERE on the old state, so two control planes can
    never both apply one action.
    """

    __tablename__ = "actions"
    __table_args__ = (Index("ix_actions_state_created", "state", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    target_kind: Mapped[str] = mapped_column(String(16))  # node | replica | model | gpu
    target: Mapped[str] = mapped_column(String(256), index=True)  # Target.key, e.g. replica:gpu-a/r0
    node: Mapped[str | None] = mapped_column(String(64))
    replica: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(256))
    params: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    policy: Mapped[str | None] = mapped_column(String(64), index=True)  # None for an operator's action
    evidence: Mapped[list[Any]]
    guardrails: Mapped[list[Any]]  # the guardrail decisions, in order
    replicas: Mapped[list[Any]]  # node/replica keys the action disrupts
    disruptive: Mapped[bool] = mapped_column(default=True)
    expected_generation: Mapped[int | None]
    requested_by: Mapped[str] = mapped_column(String(128))
    approved_by: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    outcome: Mapped[str] = mapped_column(Text, default="")


class ActionTransitionRow(Base):
    """One change of an action's state: when, from what (None: created), to what, by whom, and why."""

    __tablename__ = "action_transitions"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    action_id: Mapped[int] = mapped_column(ForeignKey("actions.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    by: Mapped[str] = mapped_column(String(128))
    cause: Mapped[str] = mapped_column(Text, default="")


class AuditEntry(Base):
    """Who did what, when, from where, to what: one row per write, in the write's own transaction."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    client: Mapped[str | None] = mapped_column(String(128))
    what: Mapped[str] = mapped_column(String(128))
    target: Mapped[str] = mapped_column(String(256), default="")
    detail: Mapped[dict[str, Any]]


class AlertRow(Base):
    """One alert, from firing to resolved; a breach that returns after resolving is a new row."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("fingerprint", "starts_at"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    labels: Mapped[dict[str, Any]]
    annotations: Mapped[dict[str, Any]]
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))  # firing | resolved
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime | None]
    action_id: Mapped[int | None] = mapped_column(ForeignKey("actions.id", ondelete="SET NULL"))
    updated_at: Mapped[datetime]
    # The policy that raised it (None: an operator's), and when its condition last held.
    policy: Mapped[str | None] = mapped_column(String(64), default=None)
    last_seen_at: Mapped[datetime | None] = mapped_column(default=None)
    resolved_reason: Mapped[str] = mapped_column(Text, default="")


class NotificationGroup(Base):
    """What one receiver was last told about one alert group (its ``group_by`` label values)."""

    __tablename__ = "notification_groups"
    __table_args__ = (UniqueConstraint("receiver", "group_key"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    receiver: Mapped[str] = mapped_column(String(128))
    group_key: Mapped[str] = mapped_column(String(512))
    group_labels: Mapped[dict[str, Any]]
    last_sent_at: Mapped[datetime | None]
    # {alert id: "firing" | "resolved"} as last told.
    told: Mapped[dict[str, Any]]


class NotificationDelivery(Base):
    """The outbox: one notification to one receiver, sent (at least once) by the leader, retried until sent or
    given up. ``notification`` is what to say, without secrets: the receiver's format renders it at send time."""

    __tablename__ = "notification_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    receiver: Mapped[str] = mapped_column(String(128))
    attempt: Mapped[int] = mapped_column(default=1)
    status: Mapped[str] = mapped_column(String(16))  # pending | sent | failed
    response_code: Mapped[int | None]
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]
    next_retry_at: Mapped[datetime | None] = mapped_column(index=True)
    group_key: Mapped[str | None] = mapped_column(String(512), default=None)
    reason: Mapped[str] = mapped_column(String(16), default="")  # new | resolved | repeat
    notification: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # The alerts it carries, for ``GET /v1/alerts/{id}``'s deliveries.
    alert_ids: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    sent_at: Mapped[datetime | None] = mapped_column(default=None)


class SilenceRow(Base):
    """An operator's silence: alerts all its matchers match are not notified from ``starts_at`` until
    ``ends_at`` (not included). Expiring it early moves ``ends_at`` to then; the row is kept for the record."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    # Alertmanager matchers in their canonical text (``alertname="pitstop-stall"``), all of which must match.
    matchers: Mapped[list[Any]]
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime] = mapped_column(index=True)
    created_by: Mapped[str] = mapped_column(String(128))  # the token's name, never the client's word
    comment: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    # Set when expired by hand (``DELETE /v1/silences/{id}``), with who did it.
    expired_at: Mapped[datetime | None] = mapped_column(default=None)
    expired_by: Mapped[str | None] = mapped_column(String(128), default=None)


class ApiToken(Base):
    """An API token: only a salted SHA-256 of its secret is kept; the token itself is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))  # viewer | operator | admin | agent
    node: Mapped[str | None] = mapped_column(String(64))  # agent tokens: the only node it may report as
    salt: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    replaced_by: Mapped[int | None]


class BreakerState(Base):
    """The remediation circuit breaker (a single row, id 1): tripped until an operator resets it."""

    __tablename__ = "breaker_state"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tripped_at: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(Text, default="")
    # Failures and disruptions before the last reset no longer count towards a new trip.
    reset_at: Mapped[datetime | None]
    reset_by: Mapped[str | None] = mapped_column(String(128))
