"""The fleet as the policy engine sees it: an immutable value built by the control plane from its store.

Times are timezone-aware (naive ones are rejected, so comparisons never mix the two). Field names mirror
``agent.wire`` (EngineSample, ProcessSample, ReplicaStatus, GpuSample). A replica's history is of
``ReplicaSample``s, the table of replica signals (``policy.signals``). Histories are time-ordered, oldest first;
the engine never reads a clock, it is handed ``now``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from agent.wire import LiveLimits, ReplicaState
from controlplane.policy.engine_args import flags_key, governed_limit
from controlplane.policy.live_cap import asked_limit, takes
from controlplane.policy.signals import ReplicaSample, aware
from engines import DEFAULT_ENGINE, EngineAdapter, EngineName, adapter

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)


def split_key(key: str) -> tuple[str, str]:
    """``node/replica`` (or a GPU finding's ``node/index``) -> its two parts: the one reading of such a key."""
    node, _, rest = key.partition("/")
    return node, rest


# Replica states in which an engine is expected to serve; detectors of serving problems look only at these.
SERVING_STATES = frozenset({ReplicaState.READY, ReplicaState.ATTACHED})


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def construct(cls: type[_M], **values: Any) -> _M:
    """``cls.model_construct(**values)`` for trusted values that name every field, no more: the store's rows become
    snapshot objects by the thousand each round, and ``model_construct``'s walk of each field for aliases and
    defaults was most of that build. A field left out (or one too many) is a TypeError, not a default."""
    fields = cls.model_fields
    if len(values) != len(fields):
        raise TypeError(f"{cls.__name__}: fields {sorted(set(fields) ^ set(values))} missing or unknown")
    m = cls.__new__(cls)
    object.__setattr__(m, "__dict__", {name: values[name] for name in fields})
    object.__setattr__(m, "__pydantic_fields_set__", set(values))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m


class Replica(_Frozen):
    node: str
    name: str
    model: str
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[int] = Field(default_factory=list)
    state: ReplicaState
    ready: bool
    # False for an attached engine Pitstop did not start: it can watch it, not restart it.
    managed: bool = True
    state_since: datetime | None = None
    engine_args: list[str] = Field(default_factory=list)
    generation: int = 0
    # The generation the control plane asked for; above ``generation`` while the agent has yet to converge.
    desired_generation: int | None = None
    restarts_total: int = 0
    last_exit_code: int | None = None
    log_tail: list[str] = Field(default_factory=list)
    history: list[ReplicaSample] = Field(default_factory=list)
    # The live-cap plug-in as last reported (None: live limits off), and the cap the control plane asked for.
    live_limits: LiveLimits | None = None
    desired_live_cap: int | None = None
    engine_kind: EngineName = DEFAULT_ENGINE

    @cached_property
    def key(self) -> str:
        """Fleet-unique name, ``node/replica`` (kept: a round reads it of every subject, for every policy)."""
        return f"{self.node}/{self.name}"

    @cached_property
    def flags_key(self) -> int:
        """``engine_args.flags_key`` of the arguments it runs with now (read on every history filter: kept)."""
        return flags_key(self.engine_args)

    @property
    def max_num_seqs(self) -> int | None:
        """The governed limit from the engine arguments (vLLM's ``--max-num-seqs``, SGLang's
        ``--max-running-requests``), None when the engine runs its own default."""
        return governed_limit(self.engine_args)

    @property
    def engine(self) -> EngineAdapter:
        """What Pitstop knows of the engine it runs (``engines/``)."""
        return adapter(self.engine_kind)

    @property
    def serving(self) -> bool:
        return self.state in SERVING_STATES

    @property
    def live(self) -> bool:
        """Its engine's live-cap plug-in is active: its running limit changes with no restart."""
        return takes(self.live_limits)

    @property
    def running_limit(self) -> int | None:
        """The most requests it is asked to run at once: its live cap where one is asked of an active plug-in
        (never above the startup limit), else its --max-num-seqs (None: vLLM's default)."""
        if self.live_limits is not None and self.live_limits.asked is not None:
            return asked_limit(self.live_limits) or self.max_num_seqs
        return self.max_num_seqs

    @property
    def converging(self) -> bool:
        """A change was asked for that the agent has not reported yet (its reported args, or its live cap, are
        about to go)."""
        if self.desired_generation is not None and self.desired_generation > self.generation:
            return True
        return self.live and self.live_limits is not None and self.desired_live_cap != self.live_limits.asked


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReading:
    at: datetime
    temperature_celsius: float | None = None
    memory_used_bytes: int | None = None
    xid_events_total: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    # The XID codes the agent read since its previous report (``GpuSample.xids``): every code, not only the last.
    xids: tuple[int, ...] = ()
    ecc_uncorrected_total: int | None = None

    def __post_init__(self) -> None:
        aware(self.at)
        if not isinstance(self.throttle_reasons, tuple):
            object.__setattr__(self, "throttle_reasons", tuple(self.throttle_reasons))
        if not isinstance(self.xids, tuple):
            object.__setattr__(self, "xids", tuple(self.xids))


class Gpu(_Frozen):
    node: str
    index: int
    uuid: str = ""
    name: str = ""
    slowdown_temperature_celsius: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    throttle_reasons: list[str] = Field(default_factory=list)
    xid_events_total: int = 0
    last_xid: int | None = None
    history: list[GpuReading] = Field(default_factory=list)

    @cached_property
    def key(self) -> str:
        return f"{self.node}/{self.index}"


class Node(_Frozen):
    name: str
    cordoned: bool = False
    cordoned_gpus: list[int] = Field(default_factory=list)
    memory_total_bytes: int | None = None
    last_report_at: AwareDatetime | None = None


class FlagTrial(_Frozen):
    """An engine flag the governor tried on a model and took back (its canary rolled back or failed)."""

    model: str
    flag: str
    value: str | None = None
    at: AwareDatetime
    outcome: str = ""


# The ``policy`` of the alert rows that Alertmanager posted (``POST /v1/alertmanager``): no Pitstop policy raised
# them, and the notifier leaves them to Alertmanager, which pages for its own alerts.
ALERTMANAGER_POLICY = "alertmanager"
# The target of an Alertmanager alert whose labels name no replica, node or model Pitstop knows.
UNMAPPED = "unmapped"


class ExternalAlert(_Frozen):
    """A firing alert Alertmanager posted, as the ``alert`` condition reads it."""

    alertname: str
    # What its labels mapped to, as a target key: ``replica:node/name``, ``node:name``, ``model:name``, or
    # ``unmapped``.
    target: str
    # When it began firing, by Alertmanager's clock (``startsAt``).
    starts_at: AwareDatetime
    labels: dict[str, str] = Field(default_factory=dict)
    fingerprint: str = ""
    severity: str = ""
    summary: str = ""


class FleetSnapshot(_Frozen):
    now: AwareDatetime
    nodes: list[Node] = Field(default_factory=list)
    gpus: list[Gpu] = Field(default_factory=list)
    replicas: list[Replica] = Field(default_factory=list)
    # Recent flag canaries that were taken back, so the governor does not retry them at once.
    flag_trials: list[FlagTrial] = Field(default_factory=list)
    # Alertmanager's alerts firing now, for the ``alert`` condition.
    external_alerts: list[ExternalAlert] = Field(default_factory=list)
    # When the control plane evaluating this began to hear reports (its start): a node's silence counts from
    # here at the earliest, so a control plane back from its own outage does not find every node dark.
    reports_since: AwareDatetime | None = None
    # Each model's disruption budget: how many of its replicas must stay READY (the guardrails' floor), for the
    # detectors that judge capacity. A model not listed is judged by nothing of the kind.
    ready_floors: dict[str, int] = Field(default_factory=dict)

    def _lookups(self) -> _Lookups:
        """Nodes, GPUs and replicas by node and model, built once per snapshot: detectors ask per replica, and a
        scan of 8,000 GPUs for each of 8,000 replicas is a round's worth of time. Kept beside the fields it was
        built from, and built again for a copy whose lists differ."""
        found: _Lookups | None = self.__dict__.get("_lookups_cache")
        if found is None or not found.built_from(self):
            found = _Lookups(self)
            self.__dict__["_lookups_cache"] = found
        return found

    def node(self, name: str) -> Node | None:
        return self._lookups().nodes.get(name)

    def gpus_of(self, replica: Replica) -> list[Gpu]:
        """The GPUs a replica runs on (same node, listed indices)."""
        return [g for g in self._lookups().gpus_by_node.get(replica.node, ()) if g.index in replica.gpus]

    def replicas_on(self, node: str, gpu_index: int | None = None) -> list[Replica]:
        """Replicas of a node, or of one GPU of it."""
        return [r for r in self._lookups().replicas_by_node.get(node, ()) if gpu_index is None or gpu_index in r.gpus]

    def replicas_of_model(self, model: str) -> list[Replica]:
        return list(self._lookups().replicas_by_model.get(model, ()))

    def memo(self, key: Hashable, build: Callable[[], _T]) -> _T:
        """``build()``, worked out once per snapshot and ``key``: what several policies of a round ask alike (the
        subjects of one scope: a dozen policies scoped to the same models, each matching 8,000 replicas by glob,
        were a third of a round at 1,000 nodes). Forgotten with the lookups, when a copy's lists differ."""
        memo = self._lookups().memo
        if key not in memo:
            memo[key] = build()
        found: _T = memo[key]
        return found


class _Lookups:
    """A snapshot's members by name, node and model, in the snapshot's order."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        self._sources = (snapshot.nodes, snapshot.gpus, snapshot.replicas)
        self.nodes: dict[str, Node] = {}
        for n in snapshot.nodes:
            self.nodes.setdefault(n.name, n)  # the first of a name, as a scan would find
        self.gpus_by_node: dict[str, list[Gpu]] = defaultdict(list)
        for g in snapshot.gpus:
            self.gpus_by_node[g.node].append(g)
        self.replicas_by_node: dict[str, list[Replica]] = defaultdict(list)
        self.replicas_by_model: dict[str, list[Replica]] = defaultdict(list)
        for r in snapshot.replicas:
            self.replicas_by_node[r.node].append(r)
            self.replicas_by_model[r.model].append(r)
        self.memo: dict[Hashable, Any] = {}  # ``FleetSnapshot.memo``

    def built_from(self, snapshot: FleetSnapshot) -> bool:
        # Asked on every lookup (tens of thousands a round): three identity checks, no generator.
        nodes, gpus, replicas = self._sources
        return nodes is snapshot.nodes and gpus is snapshot.gpus and replicas is snapshot.replicas
