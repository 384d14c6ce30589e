"""The shape of an engine adapter: plain frozen data, read by the agent and the control plane alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EngineName = Literal["vllm", "sglang"]
Kind = Literal["gauge", "gauge-max", "counter", "histogram"]


@dataclass(frozen=True)
class EngineMetric:
    """One figure the agent reads from the engine's /metrics: its key in Pitstop, how it is read, and its sample
    names, the current one first, then older names read when the current one is absent."""

    key: str
    kind: Kind
    names: tuple[str, ...]
    # Only samples whose label matches one of these values count (e.g. finished_reason=error|abort).
    label: tuple[str, frozenset[str]] | None = None
    # More such filters, all of which must hold (e.g. an HTTP status and the endpoint it answered).
    where: tuple[tuple[str, frozenset[str]], ...] = ()

    @property
    def filters(self) -> tuple[tuple[str, frozenset[str]], ...]:
        return ((self.label,) if self.label is not None else ()) + self.where


@dataclass(frozen=True)
class Probes:
    """The engine's HTTP paths the agent reads, and what they mean."""

    health: str = "/health"
    models: str = "/v1/models"  # lists the served names: STARTING ends only once it lists the model
    metrics: str = "/metrics"
    # The health path runs a generation (one token). It then costs the engine a request, is slow while a long
    # prefill holds the scheduler, and is never the liveness probe of an attached engine: ``models`` is.
    health_generates: bool = False

    @property
    def liveness(self) -> str:
        """The path that tells an attached engine answers, at no cost to it."""
        return self.models if self.health_generates else self.health


@dataclass(frozen=True)
class Shutdown:
    """How the engine stops on SIGTERM."""

    # The flag that bounds its drain (vLLM's ``--shutdown-timeout``; with 0, vLLM's default, SIGTERM aborts
    # in-flight requests). None: the engine drains on SIGTERM with no bound of its own, and the replica's
    # ``stop_timeout`` is what bounds a stop.
    timeout_flag: str | None


@dataclass(frozen=True)
class Rungs:
    """The engine's flags a flag rung of the governor is checked against, and how it is told to span GPUs."""

    switches: frozenset[str]
    valued: frozenset[str]
    multi_gpu_only: frozenset[str]
    tensor_parallel: tuple[str, ...]
    pipeline_parallel: tuple[str, ...]

    @property
    def known(self) -> frozenset[str]:
        return self.switches | self.valued


@dataclass(frozen=True)
class EngineAdapter:
    """Everything engine-specific that Pitstop reads, for one engine."""

    name: EngineName
    title: str  # as people write it: "vLLM"
    metric_prefix: str  # every metric name of the table starts with it
    metrics: tuple[EngineMetric, ...]
    probes: Probes
    served_name_flag: str
    # The default command line of a managed replica, with the placeholders ``{model}``, ``{host}`` and ``{port}``.
    command: tuple[str, ...]
    # The simulator's command-line flags that make it speak this engine (``pitstop sim serve``).
    sim_flags: tuple[str, ...]
    # The environment variable that sets how long the API server keeps an idle connection open, if any.
    keep_alive_var: str | None
    shutdown: Shutdown
    # The governor's lever: the engine's cap on requests running at once, read only at start.
    governed_flag: str
    governed_default: int | None  # what the engine runs with when the flag is absent (None: it works it out)
    rungs: Rungs
    # The label that names the served model on every metric series.
    model_label: str = "model_name"
    # Rank labels whose series are copies of one another (tensor and pipeline ranks report one batch): one counts.
    # Series that differ in any other label (data-parallel ranks, finish reasons) are summed.
    copy_labels: frozenset[str] = frozenset()
    # The process title of the engine's busy loop, where a stack dump looks first.
    core_process: str = ""
    # The flag that sets the TTFT histogram's bounds, and the engine's lowest default bound: a latency target
    # below it cannot be told apart from the bound itself.
    ttft_buckets_flag: str | None = None
    lowest_ttft_bucket: float = 0.0
    # The live cap (``agent/live_cap``) is a plug-in of this engine's scheduler.
    live_cap: bool = False

    def metric(self, key: str) -> EngineMetric | None:
        return next((m for m in self.metrics if m.key == key), None)

    def sample_names(self, key: str) -> tuple[str, ...]:
        """The sample names of figure ``key`` (empty when the engine has none)."""
        metric = self.metric(key)
        return () if metric is None else metric.names
