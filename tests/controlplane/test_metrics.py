"""The control plane's own /metrics: store gauges read on each scrape (no stale series), finished actions counted,
a database outage that leaves the other metrics served, and the process and build series."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.policy.guardrails import Decision, Verdict
from controlplane.policy.kinds import ActionKind
from controlplane.policy.lifecycle import FINAL, ActionState
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation import records
from controlplane.remediation.executor import reconcile
from controlplane.store.db import session_scope
from pitstop import __version__
from tests.controlplane.fixtures import FakeClock, body, replica, report

OPS = {"Authorization": "Bearer ops"}
AGENT = {"Authorization": "Bearer agent"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def c(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, operator_tokens=["ops"], agent_tokens=["agent"],
                          action_deadline_seconds=300)
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        yield client


def scrape(c: TestClient) -> Samples:
    answer = c.get("/metrics")
    assert answer.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def send(c: TestClient, seq: int, *replicas: object) -> None:
    r = report("gpu-a", sequence=seq, replicas=list(replicas) if replicas else None)  # type: ignore[arg-type]
    assert c.post("/v1/agents/gpu-a/report", json=body(r), headers=AGENT).status_code == 200


def propose(c: TestClient, name: str) -> int:
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    proposal = ProposedAction(policy="itl-slo", kind="restart", reason="ITL p99 above 0.2s",
                              target=Target(kind="replica", node="gpu-a", replica=name, model="tiny-llama"),
                              replicas=[f"gpu-a/{name}"], model="tiny-llama")
    with session_scope(ctx.sessions) as session:
        return records.record_decision(session=session, now=ctx.clock(), requested_by="policy:itl-slo",
                                       policy="itl-slo",
                                       decision=Decision(action=proposal, verdict=Verdict.AWAITING_APPROVAL)).id


def reconcile_now(c: TestClient) -> dict[int, str]:
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    with session_scope(ctx.sessions) as session:
        return reconcile(session=session, now=ctx.clock(), deadline=timedelta(seconds=300))


def test_every_kind_and_state_is_served_and_a_decided_proposal_reads_zero(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"))
    first, second = propose(c, "r0"), propose(c, "r1")
    before = scrape(c)
    for kind in ActionKind:
        for state in ActionState:
            assert ("pitstop_cp_actions", frozenset({("kind", kind.value), ("state", state.value)})) in before
        for outcome in FINAL:  # every child exists before its first event, so increase() sees the first one
            assert value(before, "pitstop_cp_actions_total", kind=kind.value, outcome=outcome.value) == 0
    assert value(before, "pitstop_cp_actions", kind="restart", state="proposed") == 2
    assert value(before, "pitstop_cp_actions", kind="cordon", state="proposed") == 0
    assert value(before, "pitstop_cp_nodes", status="up") == 1
    assert value(before, "pitstop_cp_nodes", status="stale") == 0

    assert c.post(f"/v1/actions/{first}/approve", headers=OPS).json()["state"] == "running"
    assert c.post(f"/v1/actions/{second}/reject", headers=OPS).json()["state"] == "rejected"
    decided = scrape(c)
    # The last proposal is decided: the series reads 0 instead of keeping its old count.
    assert value(decided, "pitstop_cp_actions", kind="restart", state="proposed") == 0
    assert value(decided, "pitstop_cp_actions", kind="restart", state="running") == 1
    assert value(decided, "pitstop_cp_actions", kind="restart", state="rejected") == 1
    assert value(decided, "pitstop_cp_actions_total", kind="restart", outcome="rejected") == 1
    assert value(decided, "pitstop_cp_actions_total", kind="restart", outcome="succeeded") == 0

    send(c, 2, replica("r0").model_copy(update={"generation": 2}), replica("r1"))
    assert reconcile_now(c) == {first: "succeeded"}
    done = scrape(c)
    assert value(done, "pitstop_cp_actions", kind="restart", state="running") == 0
    assert value(done, "pitstop_cp_actions", kind="restart", state="succeeded") == 1
    assert value(done, "pitstop_cp_actions_total", kind="restart", outcome="succeeded") == 1
    assert value(done, "pitstop_cp_actions_total", kind="restart", outcome="rejected") == 1
    assert sum(v for (name, _), v in done.items() if name == "pitstop_cp_actions_total") == 2
    assert value(done, "pitstop_cp_scrape_errors_total") == 0


def test_actions_created_final_count_and_a_rolled_back_change_does_not(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"))
    # One model, two READY replicas: the budget keeps one READY, so the second restart is suppressed.
    for name, state in (("r0", "running"), ("r1", "suppressed")):
        made = c.post(f"/v1/replicas/gpu-a/{name}/actions", json={"kind": "restart"}, headers=OPS).json()
        assert made["state"] == state
    assert value(scrape(c), "pitstop_cp_actions_total", kind="restart", outcome="suppressed") == 1

    proposed = propose(c, "r1")
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError), session_scope(ctx.sessions) as session:
        assert records.reject(session=session, action_id=proposed, by="ops", now=ctx.clock())
        raise RuntimeError("the unit of work fails after the transition")
    samples = scrape(c)
    assert value(samples, "pitstop_cp_actions_total", kind="restart", outcome="rejected") == 0
    assert value(samples, "pitstop_cp_actions", kind="restart", state="proposed") == 1


def test_a_database_outage_during_a_scrape_still_serves_the_other_metrics(tmp_path: Path, clock: FakeClock) -> None:
    db = tmp_path / "gone" / "cp.db"
    app = create_app(ServerConfig(database_url=f"sqlite:///{db}"), clock=clock, run_jobs=False)
    with TestClient(app) as c:
        assert c.post("/v1/agents/gpu-a/report", json=body(report())).status_code == 200
        assert "pitstop_cp_actions" in names(scrape(c))
        for f in db.parent.iterdir():
            f.unlink()
        db.parent.rmdir()
        app.state.pitstop.engine.dispose()  # drop pooled connections that still hold the unlinked file
        samples = scrape(c)
        assert value(samples, "pitstop_cp_reports_received_total", outcome="new") == 1
        assert value(samples, "pitstop_cp_request_duration_seconds_count", method="POST",
                     route="/v1/agents/{node}/report", status="200") == 1
        assert value(samples, "pitstop_cp_scrape_errors_total") == 1
        assert value(samples, "pitstop_cp_actions_total", kind="restart", outcome="failed") == 0
        # Nothing read from the store is served rather than a stale or made-up value.
        assert not names(samples) & {"pitstop_cp_nodes", "pitstop_cp_actions", "pitstop_cp_notifications_pending",
                                     "pitstop_cp_notification_oldest_pending_seconds"}
        assert value(scrape(c), "pitstop_cp_scrape_errors_total") == 2


def test_process_and_build_series_on_each_apps_own_registry(tmp_path: Path, clock: FakeClock) -> None:
    apps = [create_app(ServerConfig(database_url=f"sqlite:///{tmp_path / f'{i}.db'}"), clock=clock, run_jobs=False)
            for i in range(2)]  # two apps in one process: no registry collides
    for app in apps:
        with TestClient(app) as c:
            samples = scrape(c)
        assert value(samples, "pitstop_build_info", version=__version__, python=platform.python_version()) == 1
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds",
                "process_open_fds"} <= names(samples)
