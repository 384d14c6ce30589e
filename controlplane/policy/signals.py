"""The replica signals: one declared table of what a replica sample holds, and all that derives from it.

A sample is one reading of one replica, at one instant. ``ReplicaSample`` is the table: each field but ``at`` is
a signal, declared with ``signal(...)``: where its value comes from in an agent's report (a field of
``status.engine``, ``status.process`` or ``status``, or a named derivation below), how it is stored in the
sample's values (the samples table's JSON, under the field's name), how retention's one-minute averages fold
it, whether the leader's history cache keeps it, whether a threshold condition may name it, and what it means
(description and unit). Derived from the table, and written nowhere else:

- ``stored_values``: a replica's status in a report -> the sample's stored values (ingest, backfill);
- ``from_stored``: stored values -> ``ReplicaSample`` (the history cache, snapshots, the rollout's reads);
- ``ROLLUPS``: how retention folds each stored key;
- ``Signal``: the names a threshold condition may use;
- ``stored_model``: the API's typed sample values, each field described in /openapi.json.

A new signal is a field here and its producer (a wire field the agent fills, or a derivation here); docs/design.md
(Replica signals) says which files that touches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, create_model

from agent.wire import EngineWindow, ReplicaStatus
from controlplane.policy.engine_args import flags_key, governed_limit

# How a signal is kept in a sample's stored values. Every number is a JSON float (as a one-minute average makes
# it anyway): ``int`` is read back as an int, ``bool`` is stored as 1.0 or 0.0 (its average is the share of
# true) and read back as at least one half, ``digest`` is an int shared between samples (a fleet has a handful
# of distinct values), ``window`` is the agent's ``EngineWindow`` as JSON.
Stored = Literal["float", "int", "bool", "digest", "window"]
# How retention folds a minute of it: its mean, its last value, or not at all.
Rollup = Literal["mean", "last", "drop"]
Part = Literal["engine", "process", "status"]
Derivation = Callable[[ReplicaStatus], Any]


@dataclass(frozen=True, slots=True)
class Declared:
    """One signal's declaration: its ``ReplicaSample`` field's metadata."""

    source: Part | Derivation  # a part of the replica's status (its field ``wire``), or a derivation of it
    wire: str | None  # the part's field, when named otherwise than the signal
    stored: Stored
    unit: str
    description: str
    rollup: Rollup
    cached: bool  # the leader's history cache keeps it: what the detectors read
    threshold: bool  # a threshold condition may name it


_DECLARED = "signal"


def signal(source: Part | Derivation, stored: Stored, unit: str, description: str, *, wire: str | None = None,
           rollup: Rollup | None = None, cached: bool = True, threshold: bool = False) -> Any:
    """A ``ReplicaSample`` field (default None) declared as a signal; ``rollup`` defaults to the mean (a window:
    dropped)."""
    if threshold and not (cached and stored in ("float", "int")):
        raise ValueError("a threshold condition reads the history cache's numbers: a threshold signal is a cached "
                         "number")
    folded = rollup or ("drop" if stored == "window" else "mean")
    return field(default=None, metadata={_DECLARED: Declared(source, wire, stored, unit, description, folded,
                                                              cached, threshold)})


# The derivations: signals that are no one field of the report.

def preemption_rate(status: ReplicaStatus) -> float | None:
    """Preemptions per second (``EngineSample.preemption_rate``: the agent leaves a zero rate off the wire)."""
    return None if status.engine is None else status.engine.preemption_rate()


def running_limit_flag(status: ReplicaStatus) -> int | None:
    """The concurrency limit the engine was started with, from its arguments (its adapter's governed flag:
    vLLM's ``--max-num-seqs``, SGLang's ``--max-running-requests``); None: the engine's default. The one place
    the ``max_num_seqs`` signal is read from a report."""
    return governed_limit(status.engine_args)


def args_digest(status: ReplicaStatus) -> int:
    """``engine_args.flags_key`` of the engine's arguments."""
    return flags_key(status.engine_args)


_LATENCY = "over the agent's last scrape window"


# Samples are plain slotted dataclasses, not pydantic models: a 1,000-node fleet keeps about 1.4 million of
# them in the leader's history cache, and a slotted instance is a quarter of a model's size and quick to
# build. Pydantic still validates and serialises them where they sit in a snapshot's models.
@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSample:
    """One reading of one replica: engine figures, process-tree figures and the canary, at one instant."""

    at: datetime
    requests_running: float | None = signal(
        "engine", "float", "requests", "Requests the engine was running (its batch).", threshold=True)
    requests_waiting: float | None = signal(
        "engine", "float", "requests", "Requests queued for a place in the batch.", threshold=True)
    kv_cache_usage_ratio: float | None = signal(
        "engine", "float", "ratio", "Share of the KV cache in use, 0 to 1.", threshold=True)
    preemptions_total: float | None = signal(
        "engine", "float", "sequences", "Sequences preempted since the engine started (a counter).", threshold=True)
    generation_tokens_total: float | None = signal(
        "engine", "float", "tokens", "Tokens generated since the engine started (a counter).")
    generation_tokens_per_second: float | None = signal(
        "engine", "float", "tokens/s", "Tokens generated per second over the agent's scrape interval.",
        threshold=True)
    requests_per_second: float | None = signal(
        "engine", "float", "requests/s", "Requests finished per second, whatever their finish reason.",
        threshold=True)
    errors_per_second: float | None = signal(
        "engine", "float", "requests/s", "Requests finished in error or aborted per second (the agent's own "
        "canaries excepted).", threshold=True)
    preemptions_per_second: float | None = signal(
        preemption_rate, "float", "sequences/s", "Sequences preempted per second (KV cache full: their work is "
        "recomputed later).", threshold=True)
    ttft_p50_seconds: float | None = signal(
        "engine", "float", "seconds", f"Time to first token, median {_LATENCY}.", threshold=True)
    ttft_p95_seconds: float | None = signal(
        "engine", "float", "seconds", f"Time to first token, 95th percentile {_LATENCY}.", threshold=True)
    ttft_p99_seconds: float | None = signal(
        "engine", "float", "seconds", f"Time to first token, 99th percentile {_LATENCY}.", threshold=True)
    itl_p50_seconds: float | None = signal(
        "engine", "float", "seconds", f"Inter-token latency, median {_LATENCY}.", threshold=True)
    itl_p95_seconds: float | None = signal(
        "engine", "float", "seconds", f"Inter-token latency, 95th percentile {_LATENCY}.", threshold=True)
    itl_p99_seconds: float | None = signal(
        "engine", "float", "seconds", f"Inter-token latency, 99th percentile {_LATENCY}.", threshold=True)
    e2e_p99_seconds: float | None = signal(
        "engine", "float", "seconds", f"End-to-end request latency, 99th percentile {_LATENCY}.", threshold=True)
    rss_bytes: int | None = signal(
        "process", "int", "bytes", "Resident memory of the engine's process tree (API server, engine core, workers).",
        threshold=True)
    gpu_memory_bytes: int | None = signal(
        "process", "int", "bytes", "GPU memory held by the engine's processes.", threshold=True)
    # Charted, read by no decision: not worth a copy in the leader's memory.
    cpu_percent: float | None = signal(
        "process", "float", "percent", "CPU use of the engine's processes (100 per core busy).", cached=False)
    canary_ok: bool | None = signal(
        "status", "bool", "ratio", "Whether the agent's canary request succeeded: 1 yes, 0 no (a one-minute average: "
        "the share that succeeded).")
    canary_ttft_seconds: float | None = signal(
        "status", "float", "seconds", "Time to first token of the agent's canary request.", threshold=True)
    # The running limit the engine ran with when this was read; lets the governor remember which values broke
    # the SLO without any state of its own.
    max_num_seqs: int | None = signal(
        running_limit_flag, "int", "requests", "The most requests the engine was started to run at once "
        "(its governed flag: --max-num-seqs, --max-running-requests); absent: the engine's default.", rollup="last")
    # The generation (desired-state restart count) the engine ran at: samples of one engine instance, so a flag
    # change is judged only on readings taken after it.
    generation: int | None = signal(
        "status", "int", "generation", "The desired-state generation the engine ran at (one more per restart "
        "asked).", rollup="last")
    # ``engine_args.flags_key`` of the engine's arguments: which other flags the readings were taken under.
    flags_key: int | None = signal(
        args_digest, "digest", "digest", "A digest of the engine's arguments but its running limit: equal "
        "digests, same tuning.", rollup="last")
    # While WEDGED: the requests the agent counted in flight when it took the replica out of rotation.
    requests_lost: int | None = signal(
        "status", "int", "requests", "While WEDGED: the requests in flight when the agent took the replica out of "
        "rotation (lost with it).", wire="requests_in_flight_at_wedge")
    # The live cap on running requests in effect when this was read (live limits active), None otherwise.
    live_cap: int | None = signal(
        "status", "int", "requests", "The live cap on running requests in effect (live limits active).",
        rollup="last")
    # The scrape window's latency histograms, which a canary is judged on (``policy.evidence``). Kilobytes a
    # sample: read from the store where judged, never kept in the history cache.
    window: EngineWindow | None = signal(  # noqa: RUF009 (``signal`` is a ``dataclasses.field``, default None)
        "engine", "window", "seconds (bounds), observations (counts)", "The scrape window this reading closed: when "
        "it ended (the agent's clock), how long it was, its engine steps, and its TTFT and inter-token latency "
        "histograms (observations per bucket).", cached=False)

    def __post_init__(self) -> None:
        aware(self.at)

    @property
    def running_limit(self) -> int | None:
        """The most requests the engine would run at once when this was read: its live cap where one was in
        effect, else its governed flag's value (None: the engine's default)."""
        return self.live_cap if self.live_cap is not None else self.max_num_seqs


def aware(at: datetime) -> None:
    """Refuse a sample time without its timezone: comparisons must never mix naive and aware times."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"sample time {at.isoformat()} has no timezone")


DECLARED: Mapping[str, Declared] = {f.name: f.metadata[_DECLARED] for f in fields(ReplicaSample)
                                    if _DECLARED in f.metadata}
SIGNALS = frozenset(DECLARED)
REPLICA_SAMPLE_FIELDS = frozenset(f.name for f in fields(ReplicaSample))
ROLLUPS: Mapping[str, Rollup] = {name: d.rollup for name, d in DECLARED.items()}
THRESHOLD_SIGNALS = tuple(name for name, d in DECLARED.items() if d.threshold)
# The engine figures of a report that are no signal: only the latest reading of them is kept (the replica's row).
NOT_SIGNALS = frozenset({"prefix_cache_hit_ratio", "stalled", "scrape_error", "prompt_tokens_per_second"})


def _threshold_signal(name: str) -> str:
    if name not in THRESHOLD_SIGNALS:
        raise ValueError(f"{name!r} is no signal a threshold may name: one of {', '.join(THRESHOLD_SIGNALS)}")
    return name


# A signal a threshold condition names: one of the cached numbers declared ``threshold``.
Signal = Annotated[str, AfterValidator(_threshold_signal),
                   WithJsonSchema({"type": "string", "enum": list(THRESHOLD_SIGNALS)})]


# Ingest: a replica's status -> stored values.

def _dump_window(window: EngineWindow) -> dict[str, Any]:
    return window.model_dump(mode="json", exclude_none=True)


_WRITE: Mapping[Stored, Callable[[Any], Any]] = {
    "float": float, "int": float, "digest": float, "bool": lambda v: 1.0 if v else 0.0, "window": _dump_window}
# Per part of the status, the fields it gives as (key, its field there, how stored); then the derivations.
_READS: tuple[tuple[Part, tuple[tuple[str, str, Callable[[Any], Any]], ...]], ...] = tuple(
    (part, tuple((name, d.wire or name, _WRITE[d.stored]) for name, d in DECLARED.items() if d.source == part))
    for part in ("engine", "process", "status"))
_DERIVED = tuple((name, d.source, _WRITE[d.stored]) for name, d in DECLARED.items() if callable(d.source))


def stored_values(status: ReplicaStatus) -> dict[str, Any]:
    """One replica's sample as the store keeps it (its part of a ``node_samples`` row): each signal the report
    has, by name; one it lacks is left out (unknown, not zero)."""
    values: dict[str, Any] = {}
    for part, reads in _READS:
        source = status if part == "status" else getattr(status, part)
        if source is None:
            continue
        for key, name, write in reads:
            value = getattr(source, name)
            if value is not None:
                values[key] = write(value)
    for key, derive, write in _DERIVED:
        value = derive(status)
        if value is not None:
            values[key] = write(value)
    return values


# History: stored values -> ReplicaSample.

@lru_cache(maxsize=4096)
def _shared_int(value: float) -> int:
    # A fleet has a handful of distinct argument sets: one int object each, not one per cached sample (a
    # 32-bit digest is no small int Python shares, and the cache holds over a million samples at 1,000 nodes).
    return int(value)


def _read_window(value: Any) -> EngineWindow | None:
    try:
        return EngineWindow.model_validate(value)
    except ValidationError:  # stored in a shape this version no longer reads: no window, not a failed read
        return None


_READ: Mapping[Stored, Callable[[Any], Any]] = {
    "int": int, "bool": lambda v: float(v) >= 0.5, "digest": _shared_int, "window": _read_window}
Setter = Callable[[ReplicaSample, Any], None]
_SETTERS: Mapping[str, Setter] = {f.name: getattr(ReplicaSample, f.name).__set__ for f in fields(ReplicaSample)}


@dataclass(frozen=True)
class _Plan:
    """How one kind of read fills a sample: the fields copied as stored, those converted, those left None."""

    copied: tuple[tuple[Setter, str], ...]
    converted: tuple[tuple[Setter, str, Callable[[Any], Any]], ...]
    unset: tuple[Setter, ...]

    @classmethod
    def of(cls, full: bool) -> _Plan:
        kept = {name: d for name, d in DECLARED.items() if full or d.cached}
        return cls(copied=tuple((_SETTERS[n], n) for n, d in kept.items() if d.stored == "float"),
                   converted=tuple((_SETTERS[n], n, _READ[d.stored]) for n, d in kept.items() if d.stored != "float"),
                   unset=tuple(_SETTERS[n] for n in DECLARED if n not in kept))


_PLANS = {False: _Plan.of(full=False), True: _Plan.of(full=True)}
_SET_AT = _SETTERS["at"]


def from_stored(at: datetime, values: Mapping[str, Any], *, full: bool = False) -> ReplicaSample:
    """A stored sample's values as a ``ReplicaSample``: the signals the history cache keeps, or with ``full``
    every one (the scrape window too, for the canary judge). A one-minute average reads back as its signals'
    types: an int truncated, a boolean true when it was at least half the time."""
    aware(at)
    # Filled slot by slot: a frozen dataclass's __init__ sets each field through object.__setattr__, which was
    # most of the cold history read's decoding (7.7 of 12 µs a sample); the slots' own setters take under half.
    sample: ReplicaSample = object.__new__(ReplicaSample)
    _SET_AT(sample, at)
    plan = _PLANS[full]
    get = values.get
    for put, name in plan.copied:
        value = get(name)
        # Zero is the usual rate of errors, preemptions and queued requests: one shared 0.0, not a float object
        # per sample (24 bytes each, as each stored zero decodes to its own).
        put(sample, value or (None if value is None else 0.0))
    for put, name, read in plan.converted:
        value = get(name)
        put(sample, None if value is None else read(value))
    for put in plan.unset:
        put(sample, None)
    return sample


def sample_from_status(at: datetime, status: ReplicaStatus) -> ReplicaSample:
    """The sample of a replica's status in an agent report, window included: what the store keeps of it, read
    back."""
    return from_stored(at, stored_values(status), full=True)


# The API: stored values, typed and documented.

def stored_model() -> type[BaseModel]:
    """The model of a replica sample's stored values, one optional field per signal, typed as stored (numbers as
    floats: a one-minute average is one), each with its description and unit."""
    definitions: dict[str, Any] = {
        name: (EngineWindow | None if d.stored == "window" else float | None,
               Field(default=None, description=f"{d.description} Unit: {d.unit}.",
                     json_schema_extra={"x-unit": d.unit}))
        for name, d in DECLARED.items()}
    return create_model("ReplicaValues", __config__=ConfigDict(extra="ignore", frozen=True),
                        __doc__="One replica sample's signals (controlplane/policy/signals.py); a signal the agent "
                                "did not report is absent.", **definitions)
