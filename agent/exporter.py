"""The agent's own /metrics: a client_python ``Collector`` over the agent's current state.

Every exported series is declared in the table below (one row each: name, kind, meaning). Labels: ``node`` on
all but ``pitstop_build_info`` and prometheus_client's ``process_*`` (the scrape's ``instance`` names the
node); ``gpu`` on GPU series; ``replica``, ``model`` and ``engine`` (vllm, sglang) on replica series;
``state``, ``quantile``, ``reason`` and ``fault``, ``xid`` and ``blast_radius``, ``version`` and ``python`` where
noted.

=====================================  =========  ===================================================
name                                   kind       meaning
=====================================  =========  ===================================================
pitstop_gpu_temperature_celsius        gauge      GPU core temperature
pitstop_gpu_slowdown_temperature_celsius gauge    the GPU's own slowdown threshold (NVML)
pitstop_gpu_memory_used_bytes          gauge      GPU memory in use
pitstop_gpu_memory_total_bytes         gauge      GPU memory size
pitstop_gpu_utilization_ratio          gauge      GPU busy ratio 0..1
pitstop_gpu_power_watts                gauge      board power draw
pitstop_gpu_power_limit_watts          gauge      enforced power limit
pitstop_gpu_ecc_uncorrected_total      counter    uncorrected ECC errors (volatile)
pitstop_gpu_xid_events_total           counter    XID critical errors seen by the agent
pitstop_gpu_xid_errors_total           counter    XID errors per code (``xid``) and ``blast_radius`` (hardware,
                                                  application, unknown: ``agent.gpu.xid``); codes that occurred
pitstop_gpu_throttle_reason            gauge      1 while the clocks-event ``reason`` is active, 0 otherwise, for
                                                  every known reason; ``fault="true"`` for heat and hardware
                                                  slowdowns, ``"false"`` for the normal ones such as
                                                  ``sw_power_cap`` (``agent.gpu.throttle``)
pitstop_gpu_orphan_processes           gauge      processes with memory on the GPU that no replica started
pitstop_node_cordoned                  gauge      1 while the control plane has cordoned the node
pitstop_agent_backlog_readings         gauge      readings kept while the control plane was away, not yet sent
pitstop_agent_backlog_kept_total       counter    readings ever kept (a report that failed, or one taken
                                                  while the control plane was away)
pitstop_agent_backlog_sent_total       counter    kept readings the control plane answered for (stored, held
                                                  already, or refused)
pitstop_agent_backlog_dropped_total    counter    kept readings given up, oldest first, past
                                                  ``report_backlog_seconds`` (or its size bound): a hole
pitstop_agent_backlog_refused_total    counter    sent readings (or their replicas' or GPUs' parts) the control
                                                  plane refused, each with a reason in the agent's log
pitstop_gpu_cordoned                   gauge      1 while the control plane has cordoned the GPU alone
pitstop_replica_state                  gauge      1 for the replica's current state, 0 for the others
pitstop_replica_ready                  gauge      1 when READY (or an attached engine answers)
pitstop_replica_restarts_total         counter    restarts after failures
pitstop_replica_rss_bytes              gauge      host RSS of the engine's whole process tree
pitstop_replica_processes              gauge      processes in the engine's tree
pitstop_replica_gpu_memory_bytes       gauge      GPU memory held by the engine's processes
pitstop_replica_cgroup_memory_bytes    gauge      an engine in a container: the memory its cgroup is charged,
                                                  page cache included (``agent.cgroup_memory``)
pitstop_replica_cgroup_memory_limit_bytes gauge   the container's memory limit (absent when none is set)
pitstop_replica_live_cap               gauge      the live cap on running requests in effect (``live_limits``
                                                  on and its plug-in active; absent otherwise)
pitstop_engine_requests_running        gauge      requests running (the adapter's ``running``: vLLM's
                                                  num_requests_running, SGLang's num_running_reqs)
pitstop_engine_requests_waiting        gauge      requests queued (``waiting``)
pitstop_engine_kv_cache_usage_ratio    gauge      KV cache in use (``kv_usage``)
pitstop_engine_ttft_seconds            gauge      TTFT quantiles over the last scrape window
pitstop_engine_itl_seconds             gauge      inter-token latency quantiles over the last window
pitstop_engine_e2e_p99_seconds         gauge      e2e latency p99 over the last window
pitstop_engine_generation_tokens_per_second gauge generation throughput
pitstop_engine_requests_per_second     gauge      finished requests per second
pitstop_engine_errors_per_second       gauge      users' requests finished with error or abort per second
                                                  (the agent's own aborted canaries left out)
pitstop_engine_preemptions_per_second  gauge      sequences preempted per second (KV cache full)
pitstop_engine_stalled                 gauge      1 when work is queued but no token moved
pitstop_engine_scrape_errors_total     counter    failed scrapes of the engine's /metrics
pitstop_canary_ttft_seconds            gauge      TTFT of the last canary request
pitstop_canary_ok                      gauge      1 when the last canary completed in time
pitstop_canary_aborts_total            counter    canaries the agent cut at their deadline: the engine counts each
                                                  as finished_reason "abort"; the rules subtract them
pitstop_build_info                     gauge      1, labelled with the agent's ``version`` and ``python``
process_cpu_seconds_total              counter    the agent process's CPU time (prometheus_client's
                                                  process collector, with ``process_resident_memory_bytes``,
                                                  ``process_open_fds``, ``process_start_time_seconds`` ...)
=====================================  =========  ===================================================
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.gpu.throttle import FAULT_REASONS, KNOWN_REASONS
from agent.gpu.xid import classify_xid
from agent.wire import GpuSample, ReplicaState, ReplicaStatus
from engines import DEFAULT_ENGINE
from pitstop import __version__


@dataclass(frozen=True)
class ExportState:
    """Everything the exporter shows, read once per scrape."""

    node: str
    gpus: list[GpuSample] = field(default_factory=list)
    replicas: list[ReplicaStatus] = field(default_factory=list)
    scrape_errors: dict[str, int] = field(default_factory=dict)
    # Per replica: canaries the agent cut at their deadline (the engine counts each as an aborted request). Exported
    # for the rules to subtract; not in the reports (the agent's errors_per_second already leaves them out).
    canary_aborts: dict[str, int] = field(default_factory=dict)
    cordoned: bool = False
    orphans: dict[int, int] = field(default_factory=dict)  # GPU index -> processes no replica started
    cordoned_gpus: list[int] = field(default_factory=list)
    xid_counts: dict[int, dict[int, int]] = field(default_factory=dict)  # GPU index -> XID code -> events
    backlog: int = 0  # readings kept for the control plane (``agent.backlog``)
    backlog_kept: int = 0
    backlog_sent: int = 0
    backlog_dropped: int = 0
    backlog_refused: int = 0


GpuValue = Callable[[GpuSample], float | int | None]
ReplicaValue = Callable[[ReplicaStatus], float | int | None]

GPU_SERIES: tuple[tuple[str, str, str, GpuValue], ...] = (
    ("pitstop_gpu_temperature_celsius", "gauge", "GPU temperature.", lambda g: g.temperature_celsius),
    ("pitstop_gpu_slowdown_temperature_celsius", "gauge", "GPU slowdown threshold.",
     lambda g: g.slowdown_temperature_celsius),
    ("pitstop_gpu_memory_used_bytes", "gauge", "GPU memory used.", lambda g: g.memory_used_bytes),
    ("pitstop_gpu_memory_total_bytes", "gauge", "GPU memory total.", lambda g: g.memory_total_bytes),
    ("pitstop_gpu_utilization_ratio", "gauge", "GPU utilisation 0..1.", lambda g: g.utilization_ratio),
    ("pitstop_gpu_power_watts", "gauge", "GPU power draw.", lambda g: g.power_watts),
    ("pitstop_gpu_power_limit_watts", "gauge", "GPU power limit.", lambda g: g.power_limit_watts),
    ("pitstop_gpu_ecc_uncorrected", "counter", "Uncorrected ECC errors.", lambda g: g.ecc_uncorrected_total),
    ("pitstop_gpu_xid_events", "counter", "XID critical errors.", lambda g: g.xid_events_total),
)


def _eng(attr: str) -> ReplicaValue:
    return lambda r: getattr(r.engine, attr) if r.engine is not None else None


def _proc(attr: str) -> ReplicaValue:
    return lambda r: getattr(r.process, attr) if r.process is not None else None


def _bool(value: bool | None) -> float | None:
    return None if value is None else float(value)


REPLICA_SERIES: tuple[tuple[str, str, str, ReplicaValue], ...] = (
    ("pitstop_replica_ready", "gauge", "1 when the replica takes traffic.", lambda r: float(r.ready)),
    ("pitstop_replica_restarts", "counter", "Restarts after failures.", lambda r: r.restarts_total),
    ("pitstop_replica_rss_bytes", "gauge", "Host RSS of the engine process tree.", _proc("rss_bytes")),
    ("pitstop_replica_processes", "gauge", "Processes in the engine tree.", _proc("num_processes")),
    ("pitstop_replica_gpu_memory_bytes", "gauge", "GPU memory of the engine processes.",
     _proc("gpu_memory_bytes")),
    ("pitstop_replica_cgroup_memory_bytes", "gauge", "Memory charged to the engine's container cgroup.",
     _proc("cgroup_memory_bytes")),
    ("pitstop_replica_cgroup_memory_limit_bytes", "gauge", "Memory limit of the engine's container cgroup.",
     _proc("cgroup_memory_limit_bytes")),
    ("pitstop_replica_live_cap", "gauge", "Live cap on running requests in effect.", lambda r: r.live_cap),
    ("pitstop_engine_requests_running", "gauge", "Requests running.", _eng("requests_running")),
    ("pitstop_engine_requests_waiting", "gauge", "Requests waiting.", _eng("requests_waiting")),
    ("pitstop_engine_kv_cache_usage_ratio", "gauge", "KV cache usage 0..1.", _eng("kv_cache_usage_ratio")),
    ("pitstop_engine_e2e_p99_seconds", "gauge", "E2E latency p99 over the window.", _eng("e2e_p99_seconds")),
    ("pitstop_engine_generation_tokens_per_second", "gauge", "Generation tokens per second.",
     _eng("generation_tokens_per_second")),
    ("pitstop_engine_requests_per_second", "gauge", "Finished requests per second.", _eng("requests_per_second")),
    ("pitstop_engine_errors_per_second", "gauge", "Users' errored or aborted requests per second.",
     _eng("errors_per_second")),
    ("pitstop_engine_preemptions_per_second", "gauge", "Sequences preempted per second (KV cache full).",
     _eng("preemptions_per_second")),
    ("pitstop_engine_stalled", "gauge", "1 when work is queued and no token moved.",
     lambda r: _bool(r.engine.stalled) if r.engine is not None else None),
    ("pitstop_canary_ttft_seconds", "gauge", "TTFT of the last canary request.", lambda r: r.canary_ttft_seconds),
    ("pitstop_canary_ok", "gauge", "1 when the last canary completed in time.", lambda r: _bool(r.canary_ok)),
)

QUANTILE_SERIES: tuple[tuple[str, str, str], ...] = (
    ("pitstop_engine_ttft_seconds", "Time to first token over the last window.", "ttft"),
    ("pitstop_engine_itl_seconds", "Inter-token latency over the last window.", "itl"),
)
QUANTILES = (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
# (reason, fault) label pairs of every known clocks-event reason, so each GPU's series always exist.
THROTTLE_LABELS = tuple((r, "true" if r in FAULT_REASONS else "false") for r in KNOWN_REASONS)
BUILD_LABELS = (__version__, platform.python_version())


def _ids(state: ExportState, replica: ReplicaStatus) -> list[str]:
    """A replica's labels: node, replica, model and the engine it runs (``engines/``)."""
    return [state.node, replica.name, replica.model, replica.engine_kind or DEFAULT_ENGINE]


def _family(name: str, kind: str, doc: str, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class AgentCollector(Collector):
    """Yields the table's families from ``read()``, called once per scrape."""

    def __init__(self, read: Callable[[], ExportState]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        state = self.read()
        cordoned = GaugeMetricFamily("pitstop_node_cordoned", "1 while the node is cordoned.", labels=["node"])
        cordoned.add_metric([state.node], float(state.cordoned))
        yield cordoned
        backlog: tuple[tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], str, str, int], ...] = (
            (GaugeMetricFamily, "pitstop_agent_backlog_readings",
             "Readings kept while the control plane was away, not yet sent.", state.backlog),
            (CounterMetricFamily, "pitstop_agent_backlog_kept", "Readings ever kept for the control plane.",
             state.backlog_kept),
            (CounterMetricFamily, "pitstop_agent_backlog_sent", "Kept readings the control plane answered for.",
             state.backlog_sent),
            (CounterMetricFamily, "pitstop_agent_backlog_dropped", "Kept readings given up, oldest first.",
             state.backlog_dropped),
            (CounterMetricFamily, "pitstop_agent_backlog_refused", "Sent readings the control plane refused.",
             state.backlog_refused))
        for kind, name, text, value in backlog:
            family = kind(name, text, labels=["node"])
            family.add_metric([state.node], float(value))
            yield family
        build = GaugeMetricFamily("pitstop_build_info", "The agent's version and Python.",
                                  labels=["version", "python"])
        build.add_metric(BUILD_LABELS, 1.0)
        yield build
        yield from self._gpu(state)
        yield from self._replicas(state)

    def _gpu(self, state: ExportState) -> Iterable[Metric]:
        for name, kind, doc, value in GPU_SERIES:
            family = _family(name, kind, doc, ["node", "gpu"])
            for gpu in state.gpus:
                v = value(gpu)
                if v is not None:
                    family.add_metric([state.node, str(gpu.index)], float(v))
            yield family
        throttle = GaugeMetricFamily("pitstop_gpu_throttle_reason", "1 while the clocks-event reason is active.",
                                     labels=["node", "gpu", "reason", "fault"])
        for gpu in state.gpus:
            active, gpu_label = gpu.throttle_reasons, str(gpu.index)
            for reason, fault in THROTTLE_LABELS:
                throttle.add_metric([state.node, gpu_label, reason, fault], 1.0 if reason in active else 0.0)
        yield throttle
        xids = CounterMetricFamily("pitstop_gpu_xid_errors", "XID errors per code.",
                                   labels=["node", "gpu", "xid", "blast_radius"])
        for gpu_index, counts in sorted(state.xid_counts.items()):
            for code, count in sorted(counts.items()):
                xids.add_metric([state.node, str(gpu_index), str(code), classify_xid(code)], float(count))
        yield xids
        orphans = GaugeMetricFamily("pitstop_gpu_orphan_processes",
                                    "Processes holding memory on the GPU that no replica started.",
                                    labels=["node", "gpu"])
        for index in sorted({g.index for g in state.gpus} | set(state.orphans)):
            orphans.add_metric([state.node, str(index)], float(state.orphans.get(index, 0)))
        yield orphans
        cordoned = GaugeMetricFamily("pitstop_gpu_cordoned", "1 while the GPU is cordoned on its own.",
                                     labels=["node", "gpu"])
        # A cordoned GPU the backend no longer lists (fallen off the bus) is still shown as cordoned.
        for index in sorted({g.index for g in state.gpus} | set(state.cordoned_gpus)):
            cordoned.add_metric([state.node, str(index)], float(index in state.cordoned_gpus))
        yield cordoned

    def _replicas(self, state: ExportState) -> Iterable[Metric]:
        labels = ["node", "replica", "model", "engine"]
        states = GaugeMetricFamily("pitstop_replica_state", "1 for the replica's current state.",
                                   labels=[*labels, "state"])
        for r in state.replicas:
            for s in ReplicaState:
                states.add_metric([*_ids(state, r), s.value], 1.0 if r.state == s else 0.0)
        yield states
        for name, kind, doc, value in REPLICA_SERIES:
            family = _family(name, kind, doc, labels)
            for r in state.replicas:
                v = value(r)
                if v is not None:
                    family.add_metric(_ids(state, r), float(v))
            yield family
        for name, doc, prefix in QUANTILE_SERIES:
            gauge = GaugeMetricFamily(name, doc, labels=[*labels, "quantile"])
            for r in state.replicas:
                for q, suffix in QUANTILES:
                    v = getattr(r.engine, f"{prefix}_{suffix}_seconds") if r.engine is not None else None
                    if v is not None:
                        gauge.add_metric([*_ids(state, r), q], float(v))
            yield gauge
        errors = CounterMetricFamily("pitstop_engine_scrape_errors", "Failed scrapes of the engine /metrics.",
                                     labels=labels)
        for r in state.replicas:
            errors.add_metric(_ids(state, r), float(state.scrape_errors.get(r.name, 0)))
        yield errors
        aborts = CounterMetricFamily("pitstop_canary_aborts", "Canaries the agent cut at their deadline (aborted "
                                     "requests in the engine's counter, no user's error).", labels=labels)
        for r in state.replicas:
            aborts.add_metric(_ids(state, r), float(state.canary_aborts.get(r.name, 0)))
        yield aborts
