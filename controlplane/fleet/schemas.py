"""Response models of the read API (pydantic, separate from the ORM rows they are built from)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from agent.wire import EngineSample, LiveLimits, ProcessSample
from controlplane.policy.signals import stored_model


class NodeStatus(StrEnum):
    UP = "up"
    # No report within the stale timeout: the agent, its host or the network between is in trouble.
    STALE = "stale"


class NodeOut(BaseModel):
    name: str
    hostname: str
    agent_version: str
    agent_url: str | None
    status: NodeStatus
    first_seen_at: datetime
    last_report_at: datetime
    last_report_age_seconds: float
    last_sequence: int
    reports_total: int
    cordoned: bool
    # The GPUs the control plane has fenced on their own (GPU cordons); each GPU's ``cordoned`` is its agent
    # saying it applied the fence, which lags by up to a report (or forever, from an agent that is down).
    cordoned_gpus: list[int] = []
    memory_total_bytes: int | None = None
    gpu_count: int
    replica_count: int


class GpuOut(BaseModel):
    node: str
    node_status: NodeStatus
    index: int
    uuid: str
    name: str
    updated_at: datetime
    temperature_celsius: float | None = None
    slowdown_temperature_celsius: float | None = None
    shutdown_temperature_celsius: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_ratio: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    throttle_reasons: list[str] = []
    ecc_uncorrected_total: int | None = None
    xid_events_total: int = 0
    last_xid: int | None = None
    cordoned: bool = False  # fenced on its own (GPU cordon): its replicas stay drained


class ReplicaOut(BaseModel):
    node: str
    node_status: NodeStatus
    name: str
    model: str
    url: str
    managed: bool
    state: str
    ready: bool
    generation: int
    gpus: list[int]
    engine_args: list[str]
    restarts_total: int
    state_since: datetime
    last_exit_code: int | None
    log_tail: list[str]
    engine: EngineSample | None
    process: ProcessSample | None
    canary_ttft_seconds: float | None
    canary_ok: bool | None
    # The live-cap plug-in as the agent last reported it (None: live limits off).
    live_limits: LiveLimits | None = None
    # The engine it runs (``engines/``: vllm, sglang).
    engine_kind: str = "vllm"
    updated_at: datetime


class EngineColumns(BaseModel):
    """The engine readings a replicas table shows, named as in ``EngineSample`` (None: unknown)."""

    ttft_p99_seconds: float | None = None
    itl_p99_seconds: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    stalled: bool | None = None


class ProcessColumns(BaseModel):
    rss_bytes: int | None = None


class ReplicaRow(BaseModel):
    """One replica as a table row (``GET /v1/replicas?view=table``): ``ReplicaOut`` less its log tail, URL,
    canary and all but the table's readings, in the same names and nesting, so code that reads a ``ReplicaOut``
    reads a row alike."""

    node: str
    node_status: NodeStatus
    name: str
    model: str
    state: str
    ready: bool
    generation: int
    gpus: list[int]
    engine_args: list[str]
    restarts_total: int
    state_since: datetime
    updated_at: datetime
    engine: EngineColumns | None
    process: ProcessColumns | None
    live_limits: LiveLimits | None = None


class ReplicaFacets(BaseModel):
    """Replicas per model, node and state in the whole fleet, whatever the filters: the values a filter can pick."""

    model: dict[str, int]
    node: dict[str, int]
    state: dict[str, int]


class ReplicaTable(BaseModel):
    """One page of the replicas that match the filters, in the order asked, and how many match in all."""

    total: int
    offset: int
    limit: int
    sort: str
    replicas: list[ReplicaRow]
    facets: ReplicaFacets


class NodeDetail(NodeOut):
    gpus: list[GpuOut]
    replicas: list[ReplicaOut]


class EventOut(BaseModel):
    id: int
    node: str
    replica: str
    at: datetime
    received_at: datetime
    kind: str
    from_state: str | None
    to_state: str | None
    message: str


class SampleOut(BaseModel):
    """One point of a GPU's time series: its readings by ``GpuSample``'s names."""

    at: datetime
    # 0 for a raw reading, else the width in seconds of the bucket this point averages.
    resolution_seconds: int
    values: dict[str, Any]


# A replica sample's values, one field per signal of the table (``policy.signals``), built from it at import: to
# a type checker, a model like any other.
if TYPE_CHECKING:
    ReplicaValues = BaseModel
else:
    ReplicaValues = stored_model()


class ReplicaSampleOut(BaseModel):
    """One point of a replica's time series: its signals, each absent when not reported."""

    at: datetime
    resolution_seconds: int = Field(description="0 for a raw reading, else the width in seconds of the bucket "
                                                "this point folds (retention's one-minute averages).")
    values: ReplicaValues


class Problem(BaseModel):
    detail: str
