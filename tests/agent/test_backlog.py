"""What the agent keeps while the control plane is away, and how it gets there once it answers again."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import select

from agent.backlog import BATCH_BYTES, Backlog
from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.reporter import Reporter
from agent.wire import MAX_READINGS_PER_BATCH, PROTOCOL_VERSION, GpuSample, NodeReport, Readings, ReplicaEvent
from bench.harness.tcp_proxy import BlackHoleProxy
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.store.db import session_scope
from controlplane.store.models import NodeSamples
from tests.helpers import serve_in_thread

T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def _report(i: int, *, seconds: float = 1.0, log_tail: int = 0) -> NodeReport:
    return NodeReport(
        protocol_version=PROTOCOL_VERSION, node="n1", hostname="h", agent_version="0",
        sent_at=T0 + timedelta(seconds=seconds * i), sequence=i + 1,
        gpus=[GpuSample(index=0, uuid="GPU-0", name="sim", xids=[79], temperature_celsius=60.0 + i)],
        events=[ReplicaEvent(replica="r0", at=T0, kind="note", message="x" * log_tail)])


def test_a_kept_reading_leaves_its_events_and_xids_to_the_live_report() -> None:
    backlog = Backlog("n1", keep_seconds=900)
    backlog.keep_report(_report(0))
    _count, body = backlog.batch() or (0, b"")
    [reading] = Readings.model_validate_json(body).readings
    assert reading.events == [] and reading.gpus[0].xids == []  # delivered once, by the next live report
    assert reading.gpus[0].temperature_celsius == 60.0 and reading.sequence == 1


def test_the_oldest_readings_go_first_past_the_age_bound_and_are_counted() -> None:
    backlog = Backlog("n1", keep_seconds=60)
    for i in range(100):  # 100 s of readings at 1 s: the first 39 are past 60 s of the newest
        backlog.keep_report(_report(i))
    assert len(backlog) == 61 and backlog.dropped_total == 39
    count, body = backlog.batch() or (0, b"")
    batch = Readings.model_validate_json(body)
    assert count == MAX_READINGS_PER_BATCH == len(batch.readings)
    assert [r.sequence for r in batch.readings] == list(range(40, 40 + MAX_READINGS_PER_BATCH))  # oldest first
    backlog.delivered(count)
    assert len(backlog) == 1 and backlog.sent_total == count


def test_a_report_that_failed_after_its_timeout_is_kept_in_time_order() -> None:
    backlog = Backlog("n1", keep_seconds=900)
    for i in (1, 2, 0, 3):  # reading 0's report failed after readings 1 and 2 were taken while it waited
        backlog.keep_report(_report(i))
    _count, body = backlog.batch() or (0, b"")
    assert [r.sequence for r in Readings.model_validate_json(body).readings] == [1, 2, 3, 4]


def test_a_batch_stays_within_its_size_and_every_reading_is_sent_once() -> None:
    backlog = Backlog("n1", keep_seconds=900)
    for i in range(40):
        backlog.keep_report(_report(i).model_copy(update={"hostname": "h" * 200, "agent_url": "u" * 500}).model_copy(
            update={"gpus": [GpuSample(index=g, uuid=f"GPU-{g}", name="n" * 120) for g in range(64)]}))
    sent: list[int] = []
    while (batch := backlog.batch()) is not None:
        count, body = batch
        assert len(body) <= BATCH_BYTES
        sent.extend(r.sequence for r in Readings.model_validate_json(body).readings)
        backlog.delivered(count)
    assert sent == list(range(1, 41))


def test_nothing_is_kept_when_the_backlog_is_off() -> None:
    backlog = Backlog("n1", keep_seconds=0)
    backlog.keep_report(_report(0))
    assert len(backlog) == 0 and backlog.batch() is None


def test_a_batch_holds_only_readings_taken_before_the_delivered_report() -> None:
    backlog = Backlog("n1", keep_seconds=900)
    for i in range(4):  # numbered 1 to 4
        backlog.keep_report(_report(i))
    count, body = backlog.batch(through=2) or (0, b"")
    assert count == 2 and [r.sequence for r in Readings.model_validate_json(body).readings] == [1, 2]
    backlog.delivered(count)
    assert backlog.batch(through=2) is None, "readings 3 and 4 wait for a live report taken after them"
    assert len(backlog) == 2 and (backlog.batch(through=5) or (0, b""))[0] == 2


def test_a_reading_taken_while_the_first_report_was_in_flight_is_stored_not_refused(tmp_path: Path) -> None:
    """A real control plane. The agent's first report goes before its first GPU read, so it lists no GPU; a reading
    taken while that report is still in flight (a slow answer) carries GPU 0. Sent right after the first report,
    the control plane would refuse its GPU as one the node no longer lists; it goes after the next live report,
    which lists GPU 0, and is stored."""
    server = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", stale_after_seconds=30)
    app = create_app(server)
    config = AgentConfig.model_validate({
        "node": "n1", "control_plane": "http://unused", "gpu_backend": "sim", "sim_gpu_count": 1,
        "state_dir": str(tmp_path / "state")})
    kept: list[datetime] = []

    with serve_in_thread(app) as url:
        async def scenario() -> Agent:
            async with httpx.AsyncClient() as client:
                agent = Agent(config, client, SimGpuBackend(tmp_path / "gpus", 1))
                agent.reporter = Reporter(client, url, "n1")
                send = agent.reporter.send

                async def slow_first(report: NodeReport) -> object:
                    if report.sequence == 1:  # while it is on the wire: a GPU read, and a reading kept
                        assert report.gpus == []
                        await agent.collect_once()
                        agent._keep_reading()
                        kept.append(agent.backlog._kept[-1].sent_at)
                    return await send(report)

                agent.reporter.send = slow_first  # type: ignore[method-assign]
                await agent.report_once()
                await agent._send_backlog()
                assert len(agent.backlog) == 1 and agent.backlog.sent_total == 0, "held back behind report 1"
                await agent.report_once()  # lists GPU 0
                await agent._send_backlog()
                return agent

        agent = asyncio.run(scenario())

    assert agent.backlog.refused_total == 0 and agent.backlog.sent_total == 1 and len(agent.backlog) == 0
    with session_scope(app.state.pitstop.sessions) as session:
        stored = set(session.scalars(select(NodeSamples.at)))
    assert kept and kept[0] in stored


def test_every_reading_taken_across_a_partition_reaches_the_store_once_in_order(tmp_path: Path) -> None:
    """A real control plane behind a TCP proxy that black-holes the link (connections accepted, nothing passed
    on); an agent reporting every 0.2 s. Every reading the agent took, before, during and after the cut, is
    stored once; the kept ones were stored oldest first."""
    server = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", stale_after_seconds=30)
    app = create_app(server)
    config = AgentConfig.model_validate({
        "node": "n1", "control_plane": "http://unused", "gpu_backend": "sim", "sim_gpu_count": 1,
        "scrape_interval": 0.2, "report_interval": 0.2, "state_dir": str(tmp_path / "state")})
    taken: list[datetime] = []  # sent_at of every reading the agent built, live or kept

    with serve_in_thread(app) as url, BlackHoleProxy(int(url.rsplit(":", 1)[1])) as proxy:
        async def scenario() -> Agent:
            stop = asyncio.Event()
            async with httpx.AsyncClient() as client:
                agent = Agent(config, client, SimGpuBackend(tmp_path / "gpus", 1))
                # A black-holed attempt waits out its timeout: 1 s here, 10 s at the defaults.
                agent.reporter = Reporter(client, proxy.url, "n1", request_timeout=1.0)
                build = agent.build_report

                def counted() -> NodeReport:
                    report = build()
                    if report.gpus:  # the first report goes before the first pass: no reading in it yet
                        taken.append(report.sent_at)
                    return report

                agent.build_report = counted  # type: ignore[method-assign]

                async def script() -> None:
                    async def until(check: object, what: str) -> None:
                        for _ in range(600):
                            if check():  # type: ignore[operator]
                                return
                            await asyncio.sleep(0.05)
                        raise AssertionError(f"timed out waiting for {what}")

                    await until(lambda: len(taken) >= 5, "live reports")
                    proxy.cut()
                    cut_at = len(taken)
                    await until(lambda: len(taken) >= cut_at + 30 and len(agent.backlog) >= 25, "readings kept")
                    proxy.heal()
                    await until(lambda: len(agent.backlog) == 0 and agent.backlog.sent_total >= 25, "the backlog sent")
                    done = len(taken)
                    await until(lambda: len(taken) >= done + 3, "live reports after the heal")
                    stop.set()

                await asyncio.wait_for(asyncio.gather(agent._collect_loop(stop), agent._report_loop(stop),
                                                      script()), timeout=120)
                return agent

        agent = asyncio.run(scenario())

    ctx = app.state.pitstop
    with session_scope(ctx.sessions) as session:
        rows = session.execute(select(NodeSamples.id, NodeSamples.at).order_by(NodeSamples.id)).all()
    stored = [at for _, at in rows]
    assert len(stored) == len(set(stored)), "a reading was stored twice"
    # Every reading taken was stored, but the last ones: their report may not have been delivered at the stop.
    delivered = set(stored)
    missing = [t for t in taken[:-2] if t not in delivered]
    assert missing == [], f"{len(missing)} of {len(taken)} readings never reached the store"
    assert agent.backlog.dropped_total == 0 and agent.backlog.refused_total == 0
    # The kept ones were stored after the live report that reopened the link (behind it in time), oldest first.
    late, newest = [], stored[0]
    for at in stored:
        if at < newest:
            late.append(at)
        newest = max(newest, at)
    assert len(late) >= 25 and late == sorted(late)
