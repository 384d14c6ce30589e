"""``build_snapshot``: the policy engine's view of the fleet, read back from what agents reported."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from agent.wire import LiveLimits, ReplicaState
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.policy import evaluate
from controlplane.policy.snapshot import Node, Replica, construct
from controlplane.policy_files import DEFAULTS_DIR, load_directory
from controlplane.remediation.snapshot import build_snapshot
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import T0, FakeClock, body, gpu, replica, report


def test_snapshot_carries_latest_state_and_history(client: TestClient, clock: FakeClock) -> None:
    for i in range(5):
        sent = T0 + timedelta(seconds=30 * i)
        r0 = replica("r0", ttft=0.1 * (i + 1)).model_copy(update={"canary_ok": i < 4})
        crashed = replica("r1", state=ReplicaState.BACKOFF, restarts=3, model="other")
        client.post("/v1/agents/gpu-a/report", json=body(report(
            sequence=i + 1, sent_at=sent, replicas=[r0, crashed], gpus=[gpu(0, temperature=60 + i)])))
    clock.now = T0 + timedelta(seconds=150)
    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    with session_scope(ctx.sessions) as session:
        snap = build_snapshot(session=session, now=clock.now, history=timedelta(minutes=2))
        only_other = build_snapshot(session=session, now=clock.now, history=timedelta(0), model="other")
    assert [n.name for n in snap.nodes] == ["gpu-a"]
    r0, r1 = snap.replicas
    assert (r0.key, r0.model, r0.max_num_seqs, r0.ready) == ("gpu-a/r0", "tiny-llama", 64, True)
    # Two minutes back: the samples at 30, 60, 90, 120 s, oldest first.
    assert [round(s.ttft_p99_seconds or 0, 2) for s in r0.history] == [0.2, 0.3, 0.4, 0.5]
    assert [s.canary_ok for s in r0.history] == [True, True, True, False]
    assert r0.history[-1].max_num_seqs == 64 and r0.history[-1].rss_bytes == 1_800 * 1024**2
    assert (r1.state, r1.restarts_total) == (ReplicaState.BACKOFF, 3)
    assert [g.history[-1].temperature_celsius for g in snap.gpus] == [64.0]
    assert snap.gpus[0].slowdown_temperature_celsius == 89.0
    assert [r.key for r in only_other.replicas] == ["gpu-a/r1"] and only_other.gpus == []
    # The default policies run over it without error (nothing here breaks a default threshold for long enough).
    assert isinstance(evaluate(load_directory(DEFAULTS_DIR), snap, clock.now), list)


def test_gpu_history_keeps_every_xid_the_ecc_count_and_throttle_reasons(config: ServerConfig,
                                                                        clock: FakeClock) -> None:
    # No jobs: the app's own policy round would cordon the node first, and a cordoned node proposes no cordon.
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        _gpu_history_keeps_every_xid(client, clock)


def _gpu_history_keeps_every_xid(client: TestClient, clock: FakeClock) -> None:
    from controlplane.remediation.history import SampleHistory

    readings = [{"xid_events_total": 0, "ecc_uncorrected_total": 0},
                {"xid_events_total": 1, "xids": [79], "last_xid": 79, "ecc_uncorrected_total": 0},
                {"xid_events_total": 3, "xids": [45, 13], "last_xid": 13, "ecc_uncorrected_total": 2,
                 "throttle_reasons": ["sw_power_cap", "hw_slowdown"]},
                {"xid_events_total": 3, "last_xid": 13, "ecc_uncorrected_total": 2}]
    for i, update in enumerate(readings):
        client.post("/v1/agents/gpu-a/report", json=body(report(
            sequence=i + 1, sent_at=T0 + timedelta(seconds=30 * i), replicas=[replica("r0")],
            gpus=[gpu(0).model_copy(update=update)])))
    clock.now = T0 + timedelta(seconds=100)
    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    with session_scope(ctx.sessions) as session:
        fresh = build_snapshot(session=session, now=clock.now, history=timedelta(minutes=15))
        cached = build_snapshot(session=session, now=clock.now, history=timedelta(minutes=15),
                                samples=SampleHistory(timedelta(minutes=15)))
    for snap in (fresh, cached):
        [g] = snap.gpus
        assert [r.xids for r in g.history] == [(), (79,), (45, 13), ()]
        assert [r.ecc_uncorrected_total for r in g.history] == [0, 0, 2, 2]
        assert g.history[2].throttle_reasons == ("sw_power_cap", "hw_slowdown")
        assert g.last_xid == 13  # the newest code only: the history holds the others
        kinds = {(a.policy, a.kind) for a in evaluate(load_directory(DEFAULTS_DIR), snap, clock.now)}
        # XID 79 then 45 and 13: still a hardware XID, and no restart for the application codes after it.
        assert {("xid-hardware", "cordon"), ("ecc-uncorrected", "cordon")} <= kinds
        assert ("xid-application", "restart") not in kinds


def test_replicas_built_from_the_store_are_whole_models_that_share_nothing_mutable(client: TestClient,
                                                                                   clock: FakeClock) -> None:
    # The rows' JSON texts are decoded once per distinct text, and the objects built without validation: what a
    # policy reads must still be a complete, valid replica, and one replica's lists must not be another's.
    limits = LiveLimits(active=True, cap=32, requested=32, asked=32, startup_limit=64)
    twins = [replica(name).model_copy(update={"live_limits": limits}) for name in ("r0", "r1")]
    client.post("/v1/agents/gpu-a/report", json=body(report(replicas=twins)))
    ctx = client.app.state.pitstop  # type: ignore[attr-defined]
    with session_scope(ctx.sessions) as session:
        r0, r1 = build_snapshot(session=session, now=clock.now, history=timedelta(minutes=1)).replicas
    assert r0.engine_args == r1.engine_args == ["--max-num-seqs", "64"]
    assert r0.engine_args is not r1.engine_args and r0.gpus is not r1.gpus and r0.log_tail is not r1.log_tail
    assert r0.live_limits == r1.live_limits == limits and r0.running_limit == 32
    for built in (r0, r1):
        assert Replica.model_validate(built.model_dump()) == built
        assert list(built.__dict__)[:len(Replica.model_fields)] == list(Replica.model_fields)


def test_an_object_built_without_validation_must_name_every_field() -> None:
    with pytest.raises(TypeError, match="memory_total_bytes"):
        construct(Node, name="n0", cordoned=False, cordoned_gpus=[], last_report_at=None)
    node = construct(Node, name="n0", cordoned=False, cordoned_gpus=[], memory_total_bytes=None, last_report_at=None)
    assert node == Node(name="n0") and node.model_fields_set == set(Node.model_fields)
