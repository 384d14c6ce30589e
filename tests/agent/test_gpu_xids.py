"""Every XID code read reaches the control plane, once, and each code is counted on the agent's /metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from agent.config import AgentConfig
from agent.exporter import AgentCollector, ExportState
from agent.gpu.recorded import RecordedGpuBackend
from agent.gpu.xid import MAX_XIDS, XidLedger, classify_xid, merge_xids
from agent.node import Agent
from agent.wire import GpuSample


def test_merge_keeps_every_distinct_code_through_a_storm_of_one() -> None:
    assert merge_xids([79], [13, 13]) == [79, 13, 13]
    storm = merge_xids([79], [13] * 1000)
    assert len(storm) == MAX_XIDS and storm[0] == 79 and set(storm) == {79, 13}
    many = merge_xids([], range(MAX_XIDS + 3))  # more distinct codes than room: the oldest go
    assert many == list(range(3, MAX_XIDS + 3))


def test_ledger_counts_per_code_and_gives_back_what_a_failed_report_took() -> None:
    ledger = XidLedger()
    ledger.observe(0, [79])
    ledger.observe(0, [45, 45])
    ledger.observe(1, [])
    assert ledger.counts == {0: {79: 1, 45: 2}}
    taken = ledger.take()
    assert taken == {0: [79, 45, 45]} and ledger.take() == {}
    ledger.observe(0, [13])  # read while the report was away
    ledger.requeue(taken)
    assert ledger.pending(0) == [79, 45, 45, 13]


def test_xids_stay_off_the_wire_until_there_are_some() -> None:
    quiet = GpuSample(index=0, uuid="GPU-a", name="H200")
    assert "xids" not in quiet.model_dump()  # an older control plane still accepts the report
    assert GpuSample(index=0, uuid="GPU-a", name="H200", xids=[79, 13]).model_dump()["xids"] == [79, 13]


def recording(tmp_path: Path) -> Path:
    """Three reads: XID 79, then 45 and 13 in one interval, then nothing new."""
    def frame(total: int, xids: list[int]) -> dict[str, object]:
        return {"gpus": [{"index": 0, "uuid": "GPU-a", "name": "NVIDIA H200", "xid_events_total": total,
                          "last_xid": xids[-1] if xids else 13, "xids": xids}]}

    path = tmp_path / "xids.json"
    path.write_text(json.dumps({"frames": [frame(1, [79]), frame(3, [45, 13]), frame(3, [])]}))
    return path


def test_the_recorded_backend_replays_several_xids_in_one_read_and_not_again(tmp_path: Path) -> None:
    backend = RecordedGpuBackend(recording(tmp_path))
    assert [backend.read().gpus[0].xids for _ in range(4)] == [[79], [45, 13], [], []]
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"frames": [{"gpus": [{"index": 0, "uuid": "GPU-a", "name": "x", "xids": [48]}]}]}))
    once = RecordedGpuBackend(single)
    assert [once.read().gpus[0].xids for _ in range(3)] == [[48], [], []]  # the repeat logs nothing new


def test_a_report_carries_every_code_since_the_last_delivered_one(tmp_path: Path) -> None:
    config = AgentConfig.model_validate({"node": "n1", "control_plane": None, "gpu_backend": "recorded",
                                         "state_dir": str(tmp_path / "state")})

    async def scenario() -> tuple[list[list[int]], str]:
        async with httpx.AsyncClient() as client:
            agent = Agent(config, client, RecordedGpuBackend(recording(tmp_path)))
            await agent.collect_once()
            await agent.collect_once()
            first = agent.build_report()
            agent._requeue(first)  # not delivered: the next report carries the codes again
            await agent.collect_once()
            again = agent.build_report()
            delivered = agent.build_report()
            return ([g.xids for g in r.gpus] for r in (first, again, delivered)), \
                generate_latest(agent.registry).decode()

    reports, metrics = asyncio.run(scenario())
    assert list(reports) == [[[79, 45, 13]], [[79, 45, 13]], [[]]]
    assert 'pitstop_gpu_xid_errors_total{blast_radius="hardware",gpu="0",node="n1",xid="79"} 1.0' in metrics
    assert 'pitstop_gpu_xid_errors_total{blast_radius="application",gpu="0",node="n1",xid="45"} 1.0' in metrics
    assert 'pitstop_gpu_xid_errors_total{blast_radius="application",gpu="0",node="n1",xid="13"} 1.0' in metrics
    assert "process_cpu_seconds_total" in metrics and "process_resident_memory_bytes" in metrics
    assert "pitstop_build_info{" in metrics


def test_xid_counter_has_only_codes_that_occurred_with_their_blast_radius() -> None:
    gpu = GpuSample(index=0, uuid="GPU-a", name="H200")
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: ExportState(node="n1", gpus=[gpu], xid_counts={0: {48: 2, 999: 1}})))
    labels = {"node": "n1", "gpu": "0"}
    assert registry.get_sample_value("pitstop_gpu_xid_errors_total",
                                     {**labels, "xid": "48", "blast_radius": "hardware"}) == 2
    assert registry.get_sample_value("pitstop_gpu_xid_errors_total",
                                     {**labels, "xid": "999", "blast_radius": "unknown"}) == 1
    families = {f.name: f for f in registry.collect()}
    assert len(families["pitstop_gpu_xid_errors"].samples) == 2  # no series for codes that never occurred
    assert classify_xid(13) == "application"


class _FakeNvml:
    """Just enough of pynvml for the event path: two GPUs; every other call is unsupported (reads None)."""

    class NVMLError(Exception):
        pass

    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.pending: list[tuple[int, int]] = []  # (gpu index, XID code) waiting in the event set

    def __getattr__(self, name: str) -> object:
        def unsupported(*_args: object) -> object:
            raise self.NVMLError(name)
        return unsupported

    def nvmlInit(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, *_args: object) -> None:
        return None

    def nvmlEventSetWait_v2(self, _events: object, _timeout: int) -> object:
        if not self.pending:
            raise self.NVMLError("timeout")
        index, code = self.pending.pop(0)
        return type("Event", (), {"device": index, "eventData": code})()

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"


def test_nvml_reads_every_code_drained_since_the_previous_read(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    from agent.gpu.nvml import NvmlGpuBackend

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = NvmlGpuBackend()
    fake.pending = [(0, 79), (1, 13), (0, 45)]
    gpu0, gpu1 = backend.read().gpus
    assert (gpu0.xids, gpu0.xid_events_total, gpu0.last_xid) == ([79, 45], 2, 45)
    assert (gpu1.xids, gpu1.xid_events_total, gpu1.last_xid) == ([13], 1, 13)
    again = backend.read().gpus[0]
    assert (again.xids, again.xid_events_total, again.last_xid) == ([], 2, 45)  # counted once, sticky last code
    assert again.temperature_celsius is None and again.throttle_reasons == []  # unsupported reads as None


def test_xids_wait_out_an_outage_but_not_a_control_plane_that_refuses_them(tmp_path: Path) -> None:
    import pytest

    from agent.reporter import ReportError

    config = AgentConfig.model_validate({"node": "n1", "control_plane": None, "gpu_backend": "recorded",
                                         "state_dir": str(tmp_path / "state")})

    class Refusing:
        def __init__(self, status: int | None) -> None:
            self.status = status

        async def send(self, report: object) -> object:
            raise ReportError("no", status=self.status)

    async def scenario(status: int | None) -> list[int]:
        async with httpx.AsyncClient() as client:
            agent = Agent(config, client, RecordedGpuBackend(recording(tmp_path)))
            agent.reporter = Refusing(status)  # type: ignore[assignment]
            await agent.collect_once()
            with pytest.raises(ReportError):
                await agent.report_once()
            return agent.build_report().gpus[0].xids

    assert asyncio.run(scenario(None)) == [79]  # unreachable: kept for the next report
    assert asyncio.run(scenario(503)) == [79]
    assert asyncio.run(scenario(422)) == []  # an older control plane: dropped, so reports go through again
