"""The agent's /metrics text, parsed back with client_python from a fresh registry per agent."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.exporter import AgentCollector, ExportState
from agent.wire import EngineSample, GpuSample, ProcessSample, ReplicaState, ReplicaStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def state() -> ExportState:
    gpu = GpuSample(index=0, uuid="GPU-a", name="H200", temperature_celsius=61.0, memory_used_bytes=10,
                    memory_total_bytes=100, utilization_ratio=0.5, power_watts=300.0, xid_events_total=2)
    ready = ReplicaStatus(
        name="r1", model="llama", url="http://127.0.0.1:8001", state=ReplicaState.READY, ready=True,
        state_since=NOW, restarts_total=3, process=ProcessSample(pid=10, rss_bytes=2048, gpu_memory_bytes=4096,
                                                       cgroup_memory_bytes=8192),
        engine=EngineSample(requests_running=4, requests_waiting=1, kv_cache_usage_ratio=0.3,
                            ttft_p50_seconds=0.1, ttft_p99_seconds=0.9, itl_p95_seconds=0.02,
                            generation_tokens_per_second=123.0, stalled=False),
        canary_ttft_seconds=0.05, canary_ok=True)
    backing_off = ReplicaStatus(name="r2", model="qwen", url="http://127.0.0.1:8002", state=ReplicaState.BACKOFF,
                                ready=False, state_since=NOW)
    return ExportState(node="n1", gpus=[gpu], replicas=[ready, backing_off], scrape_errors={"r1": 0, "r2": 7},
                       canary_aborts={"r1": 2}, backlog=12, backlog_kept=40, backlog_sent=24, backlog_dropped=3,
                       backlog_refused=1)


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(AgentCollector(state))
    return reg


def test_values_read_back_with_labels() -> None:
    reg = registry()
    r1 = {"node": "n1", "replica": "r1", "model": "llama", "engine": "vllm"}
    r2 = {"node": "n1", "replica": "r2", "model": "qwen", "engine": "vllm"}
    assert reg.get_sample_value("pitstop_gpu_temperature_celsius", {"node": "n1", "gpu": "0"}) == 61.0
    assert reg.get_sample_value("pitstop_gpu_xid_events_total", {"node": "n1", "gpu": "0"}) == 2
    assert reg.get_sample_value("pitstop_replica_state", {**r1, "state": "READY"}) == 1.0
    assert reg.get_sample_value("pitstop_replica_state", {**r1, "state": "BACKOFF"}) == 0.0
    assert reg.get_sample_value("pitstop_replica_state", {**r2, "state": "BACKOFF"}) == 1.0
    assert reg.get_sample_value("pitstop_replica_ready", r1) == 1.0
    assert reg.get_sample_value("pitstop_replica_ready", r2) == 0.0
    assert reg.get_sample_value("pitstop_replica_restarts_total", r1) == 3
    assert reg.get_sample_value("pitstop_replica_rss_bytes", r1) == 2048
    assert reg.get_sample_value("pitstop_replica_gpu_memory_bytes", r1) == 4096
    # An engine in a container: its cgroup's charge; no limit set, no limit series.
    assert reg.get_sample_value("pitstop_replica_cgroup_memory_bytes", r1) == 8192
    assert reg.get_sample_value("pitstop_replica_cgroup_memory_limit_bytes", r1) is None
    assert reg.get_sample_value("pitstop_engine_requests_running", r1) == 4
    assert reg.get_sample_value("pitstop_engine_ttft_seconds", {**r1, "quantile": "0.99"}) == 0.9
    assert reg.get_sample_value("pitstop_engine_itl_seconds", {**r1, "quantile": "0.95"}) == 0.02
    assert reg.get_sample_value("pitstop_engine_generation_tokens_per_second", r1) == 123.0
    assert reg.get_sample_value("pitstop_engine_scrape_errors_total", r2) == 7
    assert reg.get_sample_value("pitstop_canary_ttft_seconds", r1) == 0.05
    # The canaries it cut: a counter from 0 on every replica, so the rules' subtraction always has a series.
    assert reg.get_sample_value("pitstop_canary_aborts_total", r1) == 2
    assert reg.get_sample_value("pitstop_canary_aborts_total", r2) == 0
    # What a partition left: readings kept and not yet sent, ever kept, given up, refused by the control plane.
    node = {"node": "n1"}
    assert reg.get_sample_value("pitstop_agent_backlog_readings", node) == 12
    assert reg.get_sample_value("pitstop_agent_backlog_kept_total", node) == 40
    assert reg.get_sample_value("pitstop_agent_backlog_sent_total", node) == 24
    assert reg.get_sample_value("pitstop_agent_backlog_dropped_total", node) == 3
    assert reg.get_sample_value("pitstop_agent_backlog_refused_total", node) == 1
    # Unknown values are absent, not zero: a replica with no engine sample exports no engine gauges.
    assert reg.get_sample_value("pitstop_engine_requests_running", r2) is None


def test_text_exposition_parses_and_has_one_state_series_per_state() -> None:
    text = generate_latest(registry()).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    states = [s for s in families["pitstop_replica_state"].samples if s.labels["replica"] == "r1"]
    assert len(states) == len(ReplicaState)
    assert sum(s.value for s in states) == 1
    assert families["pitstop_gpu_xid_events"].type == "counter"


def test_cordoned_gpus_are_1_including_one_the_backend_no_longer_lists() -> None:
    fenced = ExportState(node="n1", gpus=state().gpus, cordoned_gpus=[0, 3])
    reg = CollectorRegistry()
    reg.register(AgentCollector(lambda: fenced))
    assert reg.get_sample_value("pitstop_gpu_cordoned", {"node": "n1", "gpu": "0"}) == 1.0
    assert reg.get_sample_value("pitstop_gpu_cordoned", {"node": "n1", "gpu": "3"}) == 1.0  # fell off the bus
    assert reg.get_sample_value("pitstop_node_cordoned", {"node": "n1"}) == 0.0
    assert registry().get_sample_value("pitstop_gpu_cordoned", {"node": "n1", "gpu": "0"}) == 0.0


def test_every_known_throttle_reason_is_a_series_and_only_heat_and_hardware_are_faults() -> None:
    from agent.gpu.throttle import FAULT_REASONS, KNOWN_REASONS

    capped = GpuSample(index=0, uuid="GPU-a", name="H200", power_watts=691.0, power_limit_watts=700.0,
                       temperature_celsius=58.0, throttle_reasons=["sw_power_cap"])
    hot = GpuSample(index=1, uuid="GPU-b", name="H200", throttle_reasons=["sw_thermal_slowdown", "hw_slowdown"])
    reg = CollectorRegistry()
    reg.register(AgentCollector(lambda: ExportState(node="n1", gpus=[capped, hot])))
    families = {f.name: f for f in reg.collect()}
    samples = families["pitstop_gpu_throttle_reason"].samples
    assert len(samples) == 2 * len(KNOWN_REASONS) == 18
    value = {(s.labels["gpu"], s.labels["reason"]): (s.value, s.labels["fault"]) for s in samples}
    # An H200 capping its power under full load: normal, never a fault.
    assert value[("0", "sw_power_cap")] == (1.0, "false")
    assert value[("0", "hw_thermal_slowdown")] == (0.0, "true")
    assert value[("1", "sw_thermal_slowdown")] == (1.0, "true") and value[("1", "hw_slowdown")] == (1.0, "true")
    assert value[("1", "gpu_idle")] == (0.0, "false")
    assert {r for (_, r), (_, fault) in value.items() if fault == "true"} == FAULT_REASONS == {
        "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
    assert set(KNOWN_REASONS) == {"gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
                                  "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                  "hw_power_brake_slowdown", "display_clock_setting"}


def test_build_info_names_the_version_and_python() -> None:
    import platform

    from pitstop import __version__

    assert registry().get_sample_value("pitstop_build_info", {"version": __version__,
                                                              "python": platform.python_version()}) == 1.0
