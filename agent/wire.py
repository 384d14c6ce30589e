"""Wire models shared by the agent and the control plane (the agent owns them; the control plane imports them).

One report from an agent carries everything the control plane learns about a node; the answer carries the
node's desired state. Both sides validate with these models, so a malformed report is a 422, never a half
write. Bump ``PROTOCOL_VERSION`` on any incompatible change; the control plane refuses versions it does not
speak with a 4xx that names the supported ones.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

PROTOCOL_VERSION = 1

# Names are DNS-label-like so they are safe in URLs, Prometheus labels and file names.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
# XID codes one GPU sample carries at most (``GpuSample.xids``; ``agent.gpu.xid.merge_xids`` keeps to it).
MAX_XIDS = 32


class ReplicaState(StrEnum):
    """Lifecycle of one engine replica; the agent's supervisor owns every transition."""

    STOPPED = "STOPPED"
    STARTING = "STARTING"
    WARMING = "WARMING"
    READY = "READY"
    # Running, answering /health, and making no progress: readiness is off until a restart (``agent.progress``).
    # Added after protocol 1: an older control plane refuses a report carrying it, only while a replica is wedged.
    WEDGED = "WEDGED"
    DRAINING = "DRAINING"
    STOPPING = "STOPPING"
    BACKOFF = "BACKOFF"
    FATAL = "FATAL"
    # An attached engine (not started by Pitstop) that answers its probes, or does not.
    ATTACHED = "ATTACHED"
    UNREACHABLE = "UNREACHABLE"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Grown(_Wire):
    """A wire model with fields added after protocol 1, left off the wire while they hold their default.

    Both sides forbid unknown fields, so an agent or control plane that predates a field would refuse every
    message carrying it; omitted at its default, the message reads the same to both, and the field only
    travels once it is used (a mixed-version fleet then fails only where the feature is asked for).
    """

    _added_fields: ClassVar[tuple[str, ...]] = ()

    # No return annotation on purpose: pydantic would take it as the serialized schema, and the API's schema of
    # these models would become a bare object instead of their fields.
    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for name in self._added_fields:
            if not getattr(self, name):  # every added field defaults to something falsy: False, [], None
                data.pop(name, None)
        return data


class GpuSample(_Grown):
    """One GPU's readings at one instant. ``None`` means the backend could not read that field."""

    index: int = Field(ge=0, le=1023)
    uuid: str = Field(max_length=128)
    name: str = Field(max_length=128)
    temperature_celsius: float | None = None
    slowdown_temperature_celsius: float | None = None
    shutdown_temperature_celsius: float | None = None
    memory_used_bytes: int | None = Field(default=None, ge=0)
    memory_total_bytes: int | None = Field(default=None, ge=0)
    utilization_ratio: float | None = Field(default=None, ge=0, le=1)
    power_watts: float | None = Field(default=None, ge=0)
    power_limit_watts: float | None = Field(default=None, ge=0)
    throttle_reasons: list[str] = Field(default_factory=list, max_length=64)
    ecc_uncorrected_total: int | None = Field(default=None, ge=0)
    xid_events_total: int = Field(default=0, ge=0)
    last_xid: int | None = None
    # The control plane has fenced this GPU: the agent keeps the replicas that use it drained and stopped.
    cordoned: bool = False
    # Every XID code logged since the previous sample, oldest first: from a backend, since its previous read; in
    # a report, since the previous report that was delivered (``last_xid`` is only the newest of them). At most
    # ``MAX_XIDS``: past it repeats go first, so each distinct code survives; ``xid_events_total`` still
    # counts every event. Added after protocol 1: an older control plane refuses a report carrying XIDs (422),
    # and the agent then drops them rather than stop reporting.
    xids: list[int] = Field(default_factory=list, max_length=MAX_XIDS)

    _added_fields = ("cordoned", "xids")


class EngineSample(_Grown):
    """What the agent read from one engine's /metrics over the last interval (rates and window quantiles)."""

    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    preemptions_total: float | None = None
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    generation_tokens_total: float | None = None
    requests_per_second: float | None = None
    errors_per_second: float | None = None
    ttft_p50_seconds: float | None = None
    ttft_p95_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    itl_p50_seconds: float | None = None
    itl_p95_seconds: float | None = None
    itl_p99_seconds: float | None = None
    e2e_p99_seconds: float | None = None
    prefix_cache_hit_ratio: float | None = Field(default=None, ge=0, le=1)
    # Requests running or waiting while no generation token moved over the window (a wedged EngineCore).
    stalled: bool | None = None
    scrape_error: str | None = Field(default=None, max_length=2000)
    # Sequences preempted per second over the interval (KV cache full: their work is recomputed later).
    preemptions_per_second: float | None = Field(default=None, ge=0)

    _added_fields = ("preemptions_per_second",)

    def preemption_rate(self) -> float | None:
        """Preemptions per second, an omitted rate read as zero when this sample has rates at all (the agent
        leaves a zero off the wire; without a previous scrape there are no rates, and None stays None)."""
        if self.preemptions_per_second is not None:
            return self.preemptions_per_second
        has_rates = self.generation_tokens_per_second is not None and self.preemptions_total is not None
        return 0.0 if has_rates else None


class ProcessSample(_Wire):
    """Process-tree figures for one replica (API server plus EngineCore and worker children)."""

    pid: int | None = None
    rss_bytes: int | None = Field(default=None, ge=0)
    cpu_percent: float | None = Field(default=None, ge=0)
    num_threads: int | None = Field(default=None, ge=0)
    num_fds: int | None = Field(default=None, ge=0)
    num_processes: int | None = Field(default=None, ge=0)
    gpu_memory_bytes: int | None = Field(default=None, ge=0)


class ReplicaStatus(_Grown):
    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(max_length=256)
    url: str = Field(max_length=512)
    state: ReplicaState
    ready: bool
    managed: bool = True
    gpus: list[int] = Field(default_factory=list, max_length=64)
    generation: int = Field(default=0, ge=0)
    engine_args: list[str] = Field(default_factory=list, max_length=256)
    restarts_total: int = Field(default=0, ge=0)
    state_since: datetime
    last_exit_code: int | None = None
    log_tail: list[str] = Field(default_factory=list, max_length=200)
    engine: EngineSample | None = None
    process: ProcessSample | None = None
    canary_ttft_seconds: float | None = None
    canary_ok: bool | None = None
    # While WEDGED: the requests it held when the agent took it out of rotation (client connections open to it,
    # or what its gauges said while it still made progress). They are lost with it; the restart's evidence.
    requests_in_flight_at_wedge: int | None = Field(default=None, ge=0)

    _added_fields = ("requests_in_flight_at_wedge",)


class ReplicaEvent(_Wire):
    """One state transition, or another notable thing that happened to a replica."""

    replica: str = Field(pattern=NAME_PATTERN)
    at: datetime
    kind: str = Field(max_length=64)  # "transition", "crash", "orphan", ...
    from_state: ReplicaState | None = None
    to_state: ReplicaState | None = None
    message: str = Field(default="", max_length=4000)


class NodeReport(_Wire):
    protocol_version: int = Field(ge=1)
    node: str = Field(pattern=NAME_PATTERN)
    hostname: str = Field(max_length=256)
    agent_version: str = Field(max_length=64)
    agent_url: str | None = Field(default=None, max_length=512)
    # The host's memory: what a leaking engine's RSS runs out of (the leak detector projects against it).
    memory_total_bytes: int | None = Field(default=None, ge=0)
    sent_at: datetime
    # Increases by one per report; lets the control plane drop duplicates and out-of-order retries.
    sequence: int = Field(ge=0, le=2**63 - 1)  # stored as a 64-bit integer
    gpus: list[GpuSample] = Field(default_factory=list, max_length=64)
    replicas: list[ReplicaStatus] = Field(default_factory=list, max_length=64)
    events: list[ReplicaEvent] = Field(default_factory=list, max_length=1000)


class ReplicaSpec(_Grown):
    """Desired state of one replica: the engine arguments to run and the generation they belong to."""

    name: str = Field(pattern=NAME_PATTERN)
    generation: int = Field(ge=0)
    engine_args: list[str] = Field(default_factory=list, max_length=256)
    # False means: drain and stop it, and keep it stopped.
    enabled: bool = True
    # True with a new generation: dump the old engine's Python stacks (py-spy) before draining it, and send the
    # dump as a ``stack_dump`` event. A stalled engine's stacks are the evidence a restart destroys.
    capture_stack: bool = False

    _added_fields = ("capture_stack",)


class DesiredState(_Grown):
    """The control plane's answer to a report. An empty ``replicas`` list means: keep running your config."""

    protocol_version: int = PROTOCOL_VERSION
    node: str
    cordoned: bool = False
    # GPU indices fenced on their own: replicas using any of them drain and stay stopped; the rest keep running.
    cordoned_gpus: list[int] = Field(default_factory=list, max_length=1024)
    replicas: list[ReplicaSpec] = Field(default_factory=list)
    # How often the control plane wants reports, so it can slow a large fleet down.
    report_interval_seconds: float | None = None

    _added_fields = ("cordoned_gpus",)
