"""Wire models shared by the agent and the control plane (the agent owns them; the control plane imports them).

One report from an agent carries everything the control plane learns about a node; the answer carries the
node's desired state. Both sides validate with these models, so a malformed report is a 422, never a half
write. Bump ``PROTOCOL_VERSION`` on any incompatible change; the control plane refuses versions it does not
speak with a 4xx that names the supported ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, TypedDict, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from engines import DEFAULT_ENGINE, EngineName

PROTOCOL_VERSION = 1

# Names are DNS-label-like so they are safe in URLs, Prometheus labels and file names.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
# XID codes one GPU sample carries at most (``GpuSample.xids``; ``agent.gpu.xid.merge_xids`` keeps to it).
MAX_XIDS = 32

# The bounds of what a report may say, shared by both sides: the control plane refuses a report past any of them
# (422, naming the field), and the agent sends None for a reading it cannot trust (``bounded``). Integers fit the
# columns they are stored in (INTEGER, BIGINT) and the JSON the store keeps; floats are finite everywhere.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_GPU_INDEX = 1023
# Physical ranges: no GPU runs outside them, so a reading outside is a broken sensor or a broken sender.
MIN_TEMPERATURE_CELSIUS = -50.0
MAX_TEMPERATURE_CELSIUS = 200.0
MAX_POWER_WATTS = 10_000.0
# How far the agent's clock may be from the control plane's: ``sent_at`` must be within it, and no timestamp in a
# report may be later than the control plane's clock plus it (``clock_problems``). The control plane's
# ``max_clock_skew_seconds`` defaults to it.
DEFAULT_MAX_CLOCK_SKEW_SECONDS = 300.0
# No clock reading is older (year 1 with a +14:00 offset does not even convert to UTC).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


def _not_before_epoch(value: datetime) -> datetime:
    if value < EARLIEST:
        raise ValueError(f"must not be before {EARLIEST.isoformat()}")
    return value


Count = Annotated[int, Field(ge=0, le=INT64_MAX)]  # a count or a size: stored as a 64-bit integer, or in JSON
Counter32 = Annotated[int, Field(ge=0, le=INT32_MAX)]  # stored in an INTEGER column
GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
NonNegative = Annotated[float, Field(ge=0)]  # gauges, rates, totals, seconds
Ratio = Annotated[float, Field(ge=0, le=1)]
Celsius = Annotated[float, Field(ge=MIN_TEMPERATURE_CELSIUS, le=MAX_TEMPERATURE_CELSIUS)]
Watts = Annotated[float, Field(ge=0, le=MAX_POWER_WATTS)]
# A moment with its offset (a naive time is ambiguous: refused, never guessed at), not before the epoch.
Moment = Annotated[AwareDatetime, AfterValidator(_not_before_epoch)]

N = TypeVar("N", int, float)


def bounded(value: N | None, low: float, high: float) -> N | None:
    """``value`` when the wire accepts it (finite, within ``low``..``high``), else None: a reading no instrument can
    give (NaN, infinite, a GPU at 10^6 °C) is unknown, and sending it would get the whole report refused."""
    if value is None or not math.isfinite(value) or not low <= value <= high:
        return None
    return value


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
    # Floats are finite: JSON has no NaN or infinity (PostgreSQL's json refuses them), and 1e309 reads as infinity.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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

    index: GpuIndex
    uuid: str = Field(max_length=128)
    name: str = Field(max_length=128)
    temperature_celsius: Celsius | None = None
    slowdown_temperature_celsius: Celsius | None = None
    shutdown_temperature_celsius: Celsius | None = None
    memory_used_bytes: Count | None = None
    memory_total_bytes: Count | None = None
    utilization_ratio: Ratio | None = None
    power_watts: Watts | None = None
    power_limit_watts: Watts | None = None
    throttle_reasons: list[str] = Field(default_factory=list, max_length=64)
    ecc_uncorrected_total: Count | None = None
    xid_events_total: Count = 0
    last_xid: Count | None = None
    # The control plane has fenced this GPU: the agent keeps the replicas that use it drained and stopped.
    cordoned: bool = False
    # Every XID code logged since the previous sample, oldest first: from a backend, since its previous read; in
    # a report, since the previous report that was delivered (``last_xid`` is only the newest of them). At most
    # ``MAX_XIDS``: past it repeats go first, so each distinct code survives; ``xid_events_total`` still
    # counts every event. Added after protocol 1: an older control plane refuses a report carrying XIDs (422),
    # and the agent then drops them rather than stop reporting.
    xids: list[Count] = Field(default_factory=list, max_length=MAX_XIDS)

    _added_fields = ("cordoned", "xids")


MAX_BUCKETS = 64


class WindowHistogram(_Wire):
    """One engine histogram over one scrape window: the observations that fell into each bucket (not cumulative),
    ``counts[i]`` at most ``bounds[i]`` and above the bound before it, the last count above every bound."""

    bounds: list[NonNegative] = Field(max_length=MAX_BUCKETS)  # the finite upper bounds, increasing
    counts: list[NonNegative] = Field(max_length=MAX_BUCKETS + 1)

    @model_validator(mode="after")
    def _shape(self) -> WindowHistogram:
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError(f"{len(self.counts)} counts for {len(self.bounds)} bounds: need one more than bounds")
        if any(b >= a for a, b in zip(self.bounds[1:], self.bounds, strict=False)):
            raise ValueError("bounds must increase")
        return self

    @property
    def total(self) -> float:
        return sum(self.counts)


class EngineWindow(_Wire):
    """The per-request latencies one scrape window observed, for judging a canary on evidence
    (``controlplane.policy.evidence``): which window it was (it travels again in every report until the next
    scrape), how long, how many engine steps it held, and its TTFT and inter-token latency histograms."""

    ended_at: Moment  # the agent's clock at the scrape that closed the window
    seconds: NonNegative
    steps: NonNegative | None = None  # engine iterations in the window (vLLM: iteration_tokens_total's count)
    ttft: WindowHistogram | None = None
    itl: WindowHistogram | None = None


class EngineSample(_Grown):
    """What the agent read from one engine's /metrics over the last interval (rates and window quantiles)."""

    # Every reading is a count, a rate, a share or a duration: never negative (``bounded`` on the agent's side).
    requests_running: NonNegative | None = None
    requests_waiting: NonNegative | None = None
    kv_cache_usage_ratio: Ratio | None = None
    preemptions_total: NonNegative | None = None
    prompt_tokens_per_second: NonNegative | None = None
    generation_tokens_per_second: NonNegative | None = None
    generation_tokens_total: NonNegative | None = None
    requests_per_second: NonNegative | None = None
    errors_per_second: NonNegative | None = None
    ttft_p50_seconds: NonNegative | None = None
    ttft_p95_seconds: NonNegative | None = None
    ttft_p99_seconds: NonNegative | None = None
    itl_p50_seconds: NonNegative | None = None
    itl_p95_seconds: NonNegative | None = None
    itl_p99_seconds: NonNegative | None = None
    e2e_p99_seconds: NonNegative | None = None
    prefix_cache_hit_ratio: Ratio | None = None
    # Requests running or waiting while no generation token moved over the window (a wedged EngineCore).
    stalled: bool | None = None
    scrape_error: str | None = Field(default=None, max_length=2000)
    # Sequences preempted per second over the interval (KV cache full: their work is recomputed later).
    preemptions_per_second: NonNegative | None = None
    # The window's latency histograms (absent on the first scrape and after an unread one).
    window: EngineWindow | None = None

    _added_fields = ("preemptions_per_second", "window")

    def preemption_rate(self) -> float | None:
        """Preemptions per second, an omitted rate read as zero when this sample has rates at all (the agent
        leaves a zero off the wire; without a previous scrape there are no rates, and None stays None)."""
        if self.preemptions_per_second is not None:
            return self.preemptions_per_second
        has_rates = self.generation_tokens_per_second is not None and self.preemptions_total is not None
        return 0.0 if has_rates else None


class ProcessSample(_Grown):
    """Process-tree figures for one replica (API server plus EngineCore and worker children)."""

    pid: Counter32 | None = None
    rss_bytes: Count | None = None
    cpu_percent: NonNegative | None = None
    num_threads: Count | None = None
    num_fds: Count | None = None
    num_processes: Count | None = None
    gpu_memory_bytes: Count | None = None
    # An engine in a container: the memory its cgroup is charged (page cache included) and the limit the kernel
    # enforces, None when none is set (``agent.cgroup_memory``).
    cgroup_memory_bytes: Count | None = None
    cgroup_memory_limit_bytes: Count | None = None

    _added_fields = ("cgroup_memory_bytes", "cgroup_memory_limit_bytes")


class LiveLimits(_Wire):
    """The live-cap plug-in inside a replica's engine, as it last wrote its state (``agent.live_limits``)."""

    active: bool
    # Why it is not active: this vLLM's scheduler lacks what it needs, or its state could not be read.
    reason: str | None = Field(default=None, max_length=1000)
    cap: Count | None = None  # in effect now
    requested: Count | None = None  # what the cap file holds (None: no cap)
    startup_limit: Count | None = None  # what the engine was started with: the cap never goes above it
    vllm: str | None = Field(default=None, max_length=64)
    tested: bool | None = None  # this vLLM among the versions the plug-in was tested on
    error: str | None = Field(default=None, max_length=1000)  # the cap file missing or unreadable
    # What the agent last wrote to the cap file (None: no cap). An engine takes a new cap at its next step, so an
    # idle one shows it in ``cap`` only once a request comes: until then ``asked`` and ``requested`` differ.
    asked: Count | None = None


class ReplicaStatus(_Grown):
    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(max_length=256)
    url: str = Field(max_length=512)
    state: ReplicaState
    ready: bool
    managed: bool = True
    # Indices of GPUs of the same report, when it lists GPUs (``gpu_problems``).
    gpus: list[GpuIndex] = Field(default_factory=list, max_length=64)
    generation: Counter32 = 0
    engine_args: list[str] = Field(default_factory=list, max_length=256)
    restarts_total: Counter32 = 0
    state_since: Moment
    last_exit_code: int | None = Field(default=None, ge=-INT32_MAX - 1, le=INT32_MAX)
    log_tail: list[str] = Field(default_factory=list, max_length=200)
    engine: EngineSample | None = None
    process: ProcessSample | None = None
    canary_ttft_seconds: NonNegative | None = None
    canary_ok: bool | None = None
    # While WEDGED: the requests it held when the agent took it out of rotation (client connections open to it,
    # or what its gauges said while it still made progress). They are lost with it; the restart's evidence.
    requests_in_flight_at_wedge: Count | None = None
    # The live cap on running requests in effect (``live_limits: true`` and its plug-in active), and the
    # plug-in's own account of itself.
    live_cap: Count | None = None
    live_limits: LiveLimits | None = None
    # The engine the replica runs (``engines/``); None: vLLM, the engine of every replica before engines had
    # names (so a vLLM replica's report reads the same to a control plane that predates the field).
    engine_kind: EngineName | None = None

    _added_fields = ("requests_in_flight_at_wedge", "live_cap", "live_limits", "engine_kind")


def engine_kind(name: EngineName) -> EngineName | None:
    """``ReplicaStatus.engine_kind`` for an engine: None for the default one, which travels as before."""
    return None if name == DEFAULT_ENGINE else name


class ReplicaEvent(_Wire):
    """One state transition, or another notable thing that happened to a replica."""

    replica: str = Field(pattern=NAME_PATTERN)
    at: Moment
    kind: str = Field(max_length=64)  # "transition", "crash", "orphan", ...
    from_state: ReplicaState | None = None
    to_state: ReplicaState | None = None
    message: str = Field(default="", max_length=4000)


class NodeReport(_Wire):
    # Strict: a version is an integer, never "1" or true.
    protocol_version: int = Field(ge=1, le=INT32_MAX, strict=True)
    node: str = Field(pattern=NAME_PATTERN)
    hostname: str = Field(max_length=256)
    agent_version: str = Field(max_length=64)
    agent_url: str | None = Field(default=None, max_length=512)
    # The host's memory: what a leaking engine's RSS runs out of (the leak detector projects against it).
    memory_total_bytes: Count | None = None
    # The agent's clock; within the control plane's ``max_clock_skew_seconds`` of its own (``clock_problems``).
    sent_at: Moment
    # Increases by one per report; lets the control plane drop duplicates and out-of-order retries.
    sequence: int = Field(ge=0, le=INT64_MAX)  # stored as a 64-bit integer
    gpus: list[GpuSample] = Field(default_factory=list, max_length=64)
    replicas: list[ReplicaStatus] = Field(default_factory=list, max_length=64)
    events: list[ReplicaEvent] = Field(default_factory=list, max_length=1000)


# Readings one ``Readings`` batch carries at most: a minute of reports at 1 s, about 300 KiB for 8 replicas.
MAX_READINGS_PER_BATCH = 60


class Readings(_Wire):
    """What an agent took but could not deliver (its reports while the control plane was away), oldest first:
    ``POST /v1/agents/{node}/readings`` once it answers again. Stored in place as history (samples at each
    reading's ``sent_at``); a reading never moves the node's or a replica's latest state, and its events and XIDs
    travel with the next live report instead (the agent keeps those until delivered)."""

    protocol_version: int = Field(ge=1, le=INT32_MAX, strict=True)
    node: str = Field(pattern=NAME_PATTERN)
    readings: list[NodeReport] = Field(max_length=MAX_READINGS_PER_BATCH)


class RefusedReading(BaseModel):
    """One reading, or one replica's or GPU's part of it, the control plane did not store, and why."""

    # Read by agents, so lenient: a newer control plane may say more.
    model_config = ConfigDict(frozen=True, extra="ignore")

    sequence: int
    sent_at: datetime
    subject: str | None = None  # "replica <name>" or "gpu <index>"; None: the whole reading
    reason: str


class ReadingsAnswer(BaseModel):
    """The control plane's answer to ``Readings``: each reading stored, already held, or refused with its reason."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    stored: int = 0  # readings of which at least one sample was stored
    duplicates: int = 0  # readings already held (sent before, the answer lost): stored once
    refused: list[RefusedReading] = Field(default_factory=list)


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
    # The most requests the engine may run at once, changed live with no restart where the replica has
    # ``live_limits: true`` (never above its ``--max-num-seqs``); None: no cap beyond the startup limit.
    live_cap: int | None = Field(default=None, ge=1, le=INT32_MAX)

    _added_fields = ("capture_stack", "live_cap")


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


class WireProblem(TypedDict):
    """One reason a report is refused, in the shape of pydantic's errors: a 422's ``detail`` lists them."""

    type: str
    loc: list[str | int]
    msg: str
    ctx: dict[str, Any]


def gpu_problems(report: NodeReport) -> list[WireProblem]:
    """Replicas on GPUs the report does not list. A report that lists no GPUs (no GPU backend) is not checked."""
    listed = sorted({g.index for g in report.gpus})
    if not listed:
        return []
    problems: list[WireProblem] = []
    for i, replica in enumerate(report.replicas):
        unknown = sorted(set(replica.gpus) - set(listed))
        if unknown:
            problems.append(WireProblem(
                type="unknown_gpu", loc=["replicas", i, "gpus"],
                msg=f"replica {replica.name!r} is on GPU {', '.join(map(str, unknown))}, not among the GPUs of this "
                    f"report ({', '.join(map(str, listed))})",
                ctx={"unknown": unknown, "listed": listed}))
    return problems


def clock_problems(report: NodeReport, now: datetime, max_skew: timedelta) -> list[WireProblem]:
    """Timestamps a control plane whose clock reads ``now`` refuses: ``sent_at`` more than ``max_skew`` from it
    either way, and a replica's ``state_since`` or an event's ``at`` later than ``now + max_skew`` (earlier ones
    are history: events wait in the agent while the control plane is away).

    A clock far ahead would otherwise be remembered: a sequence reset is told by a later ``sent_at``
    (``controlplane.fleet.sequencing``), and samples are filed under ``sent_at``."""
    limit = max_skew.total_seconds()
    advice = (f"at most {limit:g} s of clock skew is accepted (max_clock_skew_seconds); check the clocks (NTP) of "
              "the agent's host and of the control plane")

    def problem(loc: list[str | int], skew: float) -> WireProblem:
        side = "ahead of" if skew > 0 else "behind"
        return WireProblem(type="clock_skew", loc=loc,
                           msg=f"{loc[-1]} is {abs(skew):.0f} s {side} the control plane's clock; {advice}",
                           ctx={"skew_seconds": round(skew, 3), "max_clock_skew_seconds": limit})

    problems: list[WireProblem] = []
    skew = (report.sent_at - now).total_seconds()
    if abs(skew) > limit:
        problems.append(problem(["sent_at"], skew))
    for i, replica in enumerate(report.replicas):
        ahead = (replica.state_since - now).total_seconds()
        if ahead > limit:
            problems.append(problem(["replicas", i, "state_since"], ahead))
    for i, event in enumerate(report.events):
        ahead = (event.at - now).total_seconds()
        if ahead > limit:
            problems.append(problem(["events", i, "at"], ahead))
    return problems


class OutOfOrder(BaseModel):
    """The ``detail`` of the control plane's 409 to a report it dropped as out of order: a sequence at or below
    the one it holds, sent no later. An agent that restarted while its clock was behind its previous run's, a
    late retry, or two agents reporting as one node. The agent carries on from ``last_sequence + 1``."""

    # Read by agents, so lenient: a newer control plane may say more.
    model_config = ConfigDict(frozen=True, extra="ignore")

    reason: Literal["out_of_order"] = "out_of_order"
    message: str
    sequence: int
    sent_at: datetime
    last_sequence: int = Field(ge=0, le=INT64_MAX)
    last_sent_at: datetime


M = TypeVar("M", bound=BaseModel)


def salvage(model: type[M], data: Mapping[str, Any]) -> M:
    """``data`` as a ``model``, each field that fails validation left at its default: a stored reading from before
    the wire bounded it reads as unknown rather than failing the read. ``ValidationError`` when a required field
    fails."""
    values = dict(data)
    while True:
        try:
            return model.model_validate(values)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            if not bad or not bad <= values.keys():
                raise
            for name in bad:
                del values[name]
