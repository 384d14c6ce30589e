"""Builders for agent reports and a settable clock, shared by the control-plane tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agent.wire import (
    PROTOCOL_VERSION,
    EngineSample,
    GpuSample,
    NodeReport,
    ProcessSample,
    ReplicaEvent,
    ReplicaState,
    ReplicaStatus,
)

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def replica(name: str = "r0", *, state: ReplicaState = ReplicaState.READY, ttft: float = 0.12,
            rss: int = 1_800 * 1024**2, restarts: int = 0, model: str = "tiny-llama") -> ReplicaStatus:
    return ReplicaStatus(
        name=name, model=model, url="http://127.0.0.1:9001", state=state, ready=state == ReplicaState.READY,
        gpus=[0], generation=1, engine_args=["--max-num-seqs", "64"], restarts_total=restarts,
        state_since=T0 - timedelta(minutes=5), log_tail=["INFO started"],
        engine=EngineSample(requests_running=3, requests_waiting=1, kv_cache_usage_ratio=0.42,
                            ttft_p99_seconds=ttft, itl_p99_seconds=0.021),
        process=ProcessSample(pid=4242, rss_bytes=rss, num_processes=4),
    )


def gpu(index: int = 0, *, temperature: float = 61.0) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index:04d}", name="NVIDIA H200", temperature_celsius=temperature,
                     slowdown_temperature_celsius=89.0, memory_used_bytes=70 * 1024**3,
                     memory_total_bytes=141 * 1024**3, utilization_ratio=0.8, power_watts=450.0)


def report(node: str = "gpu-a", *, sequence: int = 1, sent_at: datetime = T0,
           replicas: list[ReplicaStatus] | None = None, gpus: list[GpuSample] | None = None,
           events: list[ReplicaEvent] | None = None, hostname: str = "gpu-a.example") -> NodeReport:
    return NodeReport(
        protocol_version=PROTOCOL_VERSION, node=node, hostname=hostname, agent_version="0.1.0",
        agent_url="http://127.0.0.1:9400", sent_at=sent_at, sequence=sequence,
        gpus=[gpu()] if gpus is None else gpus,
        replicas=[replica()] if replicas is None else replicas,
        events=[] if events is None else events,
    )


def transition(
    replica_name: str, at: datetime, src: ReplicaState, dst: ReplicaState, message: str = ""
) -> ReplicaEvent:
    return ReplicaEvent(replica=replica_name, at=at, kind="transition", from_state=src, to_state=dst,
                        message=message)


def body(r: NodeReport) -> dict[str, Any]:
    return r.model_dump(mode="json")
