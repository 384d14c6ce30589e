"""The leader's incremental sample history gives the policy engine what a full read of the store would."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import insert, select

from controlplane.remediation.history import SampleHistory
from controlplane.remediation.snapshot import build_snapshot
from controlplane.rounds import PolicyRounds
from controlplane.store.db import session_scope
from controlplane.store.models import NodeSamples
from controlplane.store.samples import node_row
from tests.controlplane.fixtures import T0, FakeClock, body, gpu, replica, report


def _row(at: Any, ttft: float) -> dict[str, Any]:
    """A packed row of replica gpu-a/r1 alone, as a report of that one replica would store it."""
    row = node_row("gpu-a", at, [("replica", "r1", {"ttft_p99_seconds": ttft})])
    assert row is not None
    return row


def _post(client: TestClient, i: int, node: str = "gpu-a") -> None:
    client.post(f"/v1/agents/{node}/report", json=body(report(
        node=node, sequence=i + 1, sent_at=T0 + timedelta(seconds=10 * i),
        replicas=[replica("r0", ttft=0.1 * (i + 1)), replica("r1", ttft=0.05)], gpus=[gpu(0, temperature=50 + i)])))


def _histories(snap: object) -> list[tuple[str, list[tuple[float | None, int | None, int | None]]]]:
    # The latency, plus what the governor keys its comparisons on: the generation and the flags' digest.
    return [(r.key, [(s.ttft_p99_seconds, s.generation, s.flags_key) for s in r.history])
            for r in snap.replicas]  # type: ignore[attr-defined]


def test_incremental_rounds_see_what_a_full_read_sees(client: TestClient, clock: FakeClock) -> None:
    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    cache = SampleHistory(timedelta(minutes=1))
    for i in range(12):
        _post(client, i)
        clock.now = T0 + timedelta(seconds=10 * i + 1)
        with session_scope(ctx.sessions) as session:
            cached = build_snapshot(session=session, now=clock.now, history=timedelta(minutes=1), samples=cache)
            fresh = build_snapshot(session=session, now=clock.now, history=timedelta(minutes=1))
        assert _histories(cached) == _histories(fresh)
        assert [[g.temperature_celsius for g in x.history] for x in cached.gpus] == \
               [[g.temperature_celsius for g in x.history] for x in fresh.gpus]
    # The window slid: only the last minute is kept (samples at 60..110 s for the round at 111 s).
    [r0, _r1] = cached.replicas
    assert [round(s.ttft_p99_seconds or 0, 1) for s in r0.history] == [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]
    assert len(cache) == 6 * 3
    assert {(s.generation, s.flags_key) for s in r0.history} == {(r0.generation, r0.flags_key)}


def _three_reports(client: TestClient, clock: FakeClock) -> tuple[Any, SampleHistory]:
    """Three reports 10 s apart, the clock at 30 s, and an empty five-minute cache."""
    for i in range(3):
        _post(client, i)
    clock.now = T0 + timedelta(seconds=30)
    return client.app.state.pitstop, SampleHistory(timedelta(minutes=5))  # type: ignore[attr-defined]


def test_a_row_that_commits_after_a_larger_id_still_lands(client: TestClient, clock: FakeClock) -> None:
    # PostgreSQL hands out ids before commit: a slow report's rows can appear after a quicker one's.
    ctx, cache = _three_reports(client, clock)
    with session_scope(ctx.sessions) as session:
        cache.refresh(session, clock.now)
        top = max(session.scalars(select(NodeSamples.id)).all())
        # Leave a hole in the ids, fill the hole only after a larger id was read.
        session.execute(insert(NodeSamples).values(id=top + 5, **_row(T0 + timedelta(seconds=25), 0.5)))
    with session_scope(ctx.sessions) as session:
        cache.refresh(session, clock.now)
        session.execute(insert(NodeSamples).values(id=top + 2, **_row(T0 + timedelta(seconds=22), 0.9)))
    with session_scope(ctx.sessions) as session:
        assert cache.refresh(session, clock.now) == 1
        assert cache.refresh(session, clock.now) == 0  # read once, not again
    since = clock.now - timedelta(minutes=5)
    # In time order, whatever order the rows arrived in.
    assert [s.ttft_p99_seconds for s in cache.replica("gpu-a", "r1", since)] == [0.05, 0.05, 0.05, 0.9, 0.5]


def test_a_new_leader_term_reads_the_window_afresh(client: TestClient, clock: FakeClock) -> None:
    ctx, cache = _three_reports(client, clock)
    with session_scope(ctx.sessions) as session:
        assert cache.refresh(session, clock.now) == 9
        cache.clear()
        assert len(cache) == 0
        assert cache.refresh(session, clock.now) == 9


def _snapshot_histories(snap: Any) -> tuple[list[Any], list[Any]]:
    # Whole samples (every field: dataclass equality), per replica and per GPU, in the snapshot's order.
    return [(r.key, r.history) for r in snap.replicas], [(g.node, g.index, g.history) for g in snap.gpus]


def test_a_standby_that_followed_builds_the_snapshot_a_cold_leader_builds(client: TestClient,
                                                                           clock: FakeClock) -> None:
    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    window = timedelta(minutes=1)
    config = ctx.config.model_copy(update={"policy_history_seconds": window.total_seconds()})
    standby = PolicyRounds(sessions=ctx.sessions, config=config, clock=clock,
                           monotonic=lambda: (clock.now - T0).total_seconds())
    top = 0
    for i in range(9):  # 90 s of reports, past the one-minute window: the standby's history slides too
        _post(client, i)
        _post(client, i, node="gpu-b")
        clock.now = T0 + timedelta(seconds=10 * i + 1)
        if i == 4:
            # Ids handed out before others but committed after a follow read past them (PostgreSQL): a hole, then
            # (on PostgreSQL) every later report's ids below the largest one read, then the hole filled.
            with session_scope(ctx.sessions) as session:
                top = max(session.scalars(select(NodeSamples.id)).all())
                session.execute(insert(NodeSamples).values(id=top + 1_000, **_row(clock.now, 0.7)))
        if i == 5:
            with session_scope(ctx.sessions) as session:
                session.execute(insert(NodeSamples).values(id=top + 990, **_row(clock.now - timedelta(seconds=9), 0.9)))
        assert standby.follow() is not None
        assert standby.follow() is None  # once per policy interval, however many reports poke it
    assert standby.last_round is None  # following evaluates nothing
    _post(client, 9)
    clock.now = T0 + timedelta(seconds=92)
    with session_scope(ctx.sessions) as session:
        # Taking the lead costs the rows stored since the last follow: one report, three samples.
        assert standby.samples.refresh(session, clock.now) == 3
        warm = build_snapshot(session=session, now=clock.now, history=window, samples=standby.samples)
        cold = build_snapshot(session=session, now=clock.now, history=window,
                              samples=SampleHistory(window))
        table = build_snapshot(session=session, now=clock.now, history=window)
    assert _snapshot_histories(warm) == _snapshot_histories(cold) == _snapshot_histories(table)
    late = [s.ttft_p99_seconds for s in warm.replicas[1].history]
    assert 0.9 in late and 0.7 in late  # the late commit landed, once
    assert sum(len(h) for _, h in _snapshot_histories(warm)[0]) == len(
        [s for r in table.replicas for s in r.history])


def test_the_rounds_reread_only_the_nodes_that_reported_and_build_what_a_full_read_builds(
        client: TestClient, clock: FakeClock) -> None:
    from controlplane.fleet.desired import DesiredChange, set_desired
    from controlplane.remediation.snapshot import FleetRows

    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    rows = FleetRows()

    def both() -> tuple[Any, Any]:
        with session_scope(ctx.sessions) as session:
            cached = build_snapshot(session=session, now=clock.now, history=timedelta(0), rows=rows)
            full = build_snapshot(session=session, now=clock.now, history=timedelta(0))
        return cached.model_dump(), full.model_dump()

    for node in ("gpu-b", "gpu-a", "gpu-c"):
        _post(client, 0, node=node)
    cached, full = both()
    assert cached == full and rows.read_nodes == 3
    _post(client, 1, node="gpu-b")  # one node reports: its rows alone are read again
    cached, full = both()
    assert cached == full and rows.read_nodes == 1
    assert [r["history"] for r in cached["replicas"]] == [[]] * 6
    with session_scope(ctx.sessions) as session:  # an operator's wish changes no report
        set_desired(session=session, node="gpu-c", name="r1", change=DesiredChange(restart=True), now=clock.now)
    cached, full = both()
    assert cached == full and rows.read_nodes == 0
    assert [r["desired_generation"] for r in cached["replicas"] if r["node"] == "gpu-c"] == [None, 2]
    assert client.delete("/v1/nodes/gpu-a").status_code in (200, 204)  # forgotten: gone with its rows
    cached, full = both()
    assert cached == full and {r["node"] for r in cached["replicas"]} == {"gpu-b", "gpu-c"}


def test_the_rounds_snapshot_keeps_the_objects_of_nodes_that_changed_nothing(client: TestClient,
                                                                            clock: FakeClock) -> None:
    from controlplane.fleet.desired import DesiredChange, set_desired
    from controlplane.remediation.snapshot import FleetRows

    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    window = timedelta(minutes=1)
    rows, cache = FleetRows(), SampleHistory(window)

    def both() -> tuple[Any, Any]:
        with session_scope(ctx.sessions) as session:
            kept = build_snapshot(session=session, now=clock.now, history=window, samples=cache, rows=rows)
            full = build_snapshot(session=session, now=clock.now, history=window)
        assert kept.model_dump() == full.model_dump()  # histories included
        return kept, full

    def objects(snap: Any, node: str) -> list[int]:
        return [id(o) for o in [*snap.nodes, *snap.replicas, *snap.gpus] if getattr(o, "node", o.name) == node]

    for node in ("gpu-b", "gpu-a", "gpu-c"):
        _post(client, 0, node=node)
    clock.now = T0 + timedelta(seconds=1)
    first, _ = both()
    assert rows.built_nodes == 3
    _post(client, 1, node="gpu-b")  # one node reports: it alone is built again
    clock.now = T0 + timedelta(seconds=11)
    second, _ = both()
    assert rows.built_nodes == 1
    assert objects(second, "gpu-a") == objects(first, "gpu-a") and objects(second, "gpu-b") != objects(first, "gpu-b")
    with session_scope(ctx.sessions) as session:  # an operator's wish changes no report, but the replica
        set_desired(session=session, node="gpu-c", name="r1", change=DesiredChange(restart=True), now=clock.now)
    third, _ = both()
    assert rows.built_nodes == 1 and objects(third, "gpu-c") != objects(second, "gpu-c")
    assert [r.desired_generation for r in third.replicas if r.node == "gpu-c"] == [None, 2]
    clock.now = T0 + timedelta(seconds=62)  # the first reports' samples leave the window; gpu-b's second stays
    fourth, _ = both()
    assert rows.built_nodes == 3
    assert [len(r.history) for r in fourth.replicas] == [0, 0, 1, 1, 0, 0]
    assert client.delete("/v1/nodes/gpu-a").status_code in (200, 204)  # forgotten: gone with its objects
    fifth, _ = both()
    assert rows.built_nodes == 0 and {r.node for r in fifth.replicas} == {"gpu-b", "gpu-c"}
