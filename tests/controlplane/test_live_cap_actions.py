"""``set_live_cap``: an operator's cap on a replica's running requests, written with no new generation, judged
by the agent's report of its plug-in, held back by no disruption budget, and refused where it cannot work."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agent.wire import LiveLimits, ReplicaState, ReplicaStatus
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.remediation.executor import reconcile
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import FakeClock, body, replica, report

OPS = {"Authorization": "Bearer ops"}
AGENT = {"Authorization": "Bearer agent"}


@pytest.fixture
def c(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, operator_tokens=["ops"], agent_tokens=["agent"],
                          action_deadline_seconds=300)
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        yield client


def live(name: str, *, asked: int | None = None, active: bool = True, reason: str | None = None,
         state: ReplicaState = ReplicaState.READY, startup: int = 64) -> ReplicaStatus:
    """A replica whose engine runs the live-cap plug-in, as the agent reports it (``asked``: what it wrote)."""
    limits = LiveLimits(active=active, reason=reason, cap=asked or startup if active else None, requested=asked,
                        startup_limit=startup if active else None, vllm="0.32.0", tested=True, asked=asked)
    return replica(name, state=state).model_copy(update={"live_limits": limits,
                                                         "live_cap": limits.cap if active else None})


def send(c: TestClient, seq: int, *replicas: ReplicaStatus) -> dict[str, dict[str, Any]]:
    now = c.app.state.pitstop.clock()  # type: ignore[attr-defined]
    answer = c.post("/v1/agents/gpu-a/report",
                    json=body(report("gpu-a", sequence=seq, sent_at=now, replicas=list(replicas))), headers=AGENT)
    assert answer.status_code == 200
    return {s["name"]: s for s in answer.json()["replicas"]}


def reconcile_now(c: TestClient) -> dict[int, str]:
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    with session_scope(ctx.sessions) as session:
        return reconcile(session=session, now=ctx.clock(), deadline=timedelta(seconds=300))


def cap(c: TestClient, name: str, value: int | None, **extra: Any) -> Any:
    return c.post(f"/v1/replicas/gpu-a/{name}/actions", json={"kind": "set_live_cap", "live_cap": value, **extra},
                  headers=OPS)


def test_a_live_cap_reaches_the_agent_with_no_new_generation_and_succeeds_once_the_agent_wrote_it(
        c: TestClient, clock: FakeClock) -> None:
    send(c, 1, live("r0"), live("r1"))
    made = cap(c, "r0", 16, reason="ITL p99 over the SLO")
    assert made.status_code == 201, made.text
    action = made.json()
    assert action["kind"] == "set_live_cap" and action["state"] == "running"
    assert action["params"] == {"live_cap": 16, "canary": False, "applied": {"gpu-a/r0": 1}}
    desired = send(c, 2, live("r0"), live("r1"))
    # The same generation and arguments: nothing restarts, and r1 is not touched at all.
    assert desired["r0"] == {"name": "r0", "generation": 1, "engine_args": ["--max-num-seqs", "64"],
                             "enabled": True, "live_cap": 16}
    assert "r1" not in desired
    assert reconcile_now(c) == {}  # the agent has not written it yet
    send(c, 3, live("r0", asked=16), live("r1"))
    assert reconcile_now(c) == {action["id"]: "succeeded"}
    # What the console reads: the plug-in's report, in the replica and in its table row.
    shown = c.get("/v1/replicas/gpu-a/r0", headers=OPS).json()["live_limits"]
    assert (shown["active"], shown["asked"], shown["startup_limit"]) == (True, 16, 64)
    table = c.get("/v1/replicas", params={"view": "table"}, headers=OPS).json()["replicas"]
    assert {r["name"]: (r["live_limits"] or {}).get("asked") for r in table} == {"r0": 16, "r1": None}
    done = c.get(f"/v1/actions/{action['id']}", headers=OPS).json()
    assert done["outcome"].startswith("live cap 16 written for gpu-a/r0") and "no restart" in done["outcome"]
    # The cap each reading ran under is kept with it.
    samples = c.get("/v1/replicas/gpu-a/r0/samples", headers=OPS).json()
    assert [s["values"].get("live_cap") for s in samples].count(16.0) == 1

    # A second change of the same replica waits out the cooldown, as a flag change does.
    soon = cap(c, "r0", None).json()
    assert soon["state"] == "suppressed" and soon["guardrails"][0]["guardrail"] == "cooldown"
    clock.advance(601)
    # Lifting it: null is a value, and the spec says no cap again.
    lifted = cap(c, "r0", None).json()
    assert lifted["state"] == "running" and lifted["params"]["live_cap"] is None
    assert lifted["params"]["previous"] == 16
    assert "live_cap" not in send(c, 4, live("r0", asked=16), live("r1"))["r0"]
    send(c, 5, live("r0"), live("r1"))
    assert reconcile_now(c) == {lifted["id"]: "succeeded"}


def test_a_live_cap_is_held_by_no_disruption_budget_where_a_restart_is(c: TestClient) -> None:
    send(c, 1, live("r0"), live("r1"))  # one model, two READY: the budget keeps one READY
    restart = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=OPS).json()
    assert restart["state"] == "running"
    held = c.post("/v1/replicas/gpu-a/r1/actions", json={"kind": "restart"}, headers=OPS).json()
    assert held["state"] == "suppressed" and held["guardrails"][0]["guardrail"] == "disruption_budget"
    # Nothing leaves rotation: the same replica takes a live cap while r0 restarts.
    capped = cap(c, "r1", 8).json()
    assert capped["state"] == "running", capped
    preview = c.post("/v1/replicas/gpu-a/r1/actions?dry_run=true", json={"kind": "set_live_cap", "live_cap": 4},
                     headers=OPS)
    assert preview.status_code == 409  # one change of the model's concurrency at a time
    assert "already running" in preview.json()["detail"]


def test_a_live_cap_is_refused_where_it_cannot_work_and_nothing_is_recorded(c: TestClient) -> None:
    send(c, 1, replica("plain"), live("off", active=False, reason="this vLLM's scheduler lacks max_num_active_reqs"),
         live("r0", asked=16))
    plain = cap(c, "plain", 8)
    assert plain.status_code == 409 and "runs without live limits" in plain.json()["detail"]
    refused = cap(c, "off", 8)
    assert refused.status_code == 409 and "lacks max_num_active_reqs" in refused.json()["detail"]
    above = cap(c, "r0", 65)
    assert above.status_code == 409 and "above gpu-a/r0's startup --max-num-seqs 64" in above.json()["detail"]
    same = cap(c, "r0", 16)
    assert same.status_code == 409 and "already has a live cap of 16" in same.json()["detail"]
    for bad in ({"kind": "set_live_cap"}, {"kind": "set_live_cap", "live_cap": 0},
                {"kind": "restart", "live_cap": 8}, {"kind": "set_live_cap", "live_cap": "many"}):
        assert c.post("/v1/replicas/gpu-a/r0/actions", json=bad, headers=OPS).status_code == 422, bad
    assert c.get("/v1/actions", headers=OPS).json() == []


def test_a_live_cap_fails_when_the_engine_comes_back_without_its_plug_in_and_waits_while_it_starts(
        c: TestClient, clock: FakeClock) -> None:
    send(c, 1, live("r0"), live("r1"))
    action = cap(c, "r0", 16).json()
    starting = replica("r0", state=ReplicaState.STARTING)  # its new engine has written no state yet
    send(c, 2, starting, live("r1"))
    assert reconcile_now(c) == {}
    send(c, 3, live("r0", active=False, reason="vLLM's Scheduler has no attribute max_num_active_reqs"),
         live("r1"))
    assert reconcile_now(c) == {action["id"]: "failed"}
    outcome = c.get(f"/v1/actions/{action['id']}", headers=OPS).json()["outcome"]
    assert "not active on gpu-a/r0" in outcome and "max_num_active_reqs" in outcome


def test_a_models_max_num_seqs_is_set_live_where_every_replica_can_take_it_and_by_restarts_elsewhere(
        c: TestClient) -> None:
    send(c, 1, live("r0"), live("r1"), replica("m0", model="other"), live("m1", startup=64).model_copy(
        update={"model": "other"}))
    made = c.post("/v1/models/tiny-llama/actions", json={"kind": "set_max_num_seqs", "max_num_seqs": 32}, headers=OPS)
    assert made.status_code == 201, made.text
    action = made.json()
    assert action["kind"] == "set_live_cap" and action["target"] == "replica:gpu-a/r0"
    assert action["params"]["live_cap"] == 32 and action["params"]["canary"] is True
    assert "as a live cap (no restart)" in action["reason"]
    desired = send(c, 2, live("r0"), live("r1"), replica("m0", model="other"))
    assert desired["r0"]["generation"] == 1 and desired["r0"]["live_cap"] == 32 and "r1" not in desired
    # Above the engines' startup limit, or with a replica that cannot take a live cap: a canaried restart.
    above = c.post("/v1/models/tiny-llama/actions?dry_run=true",
                   json={"kind": "set_max_num_seqs", "max_num_seqs": 128}, headers=OPS)
    assert above.status_code == 409  # one change of the model's concurrency at a time
    mixed = c.post("/v1/models/other/actions", json={"kind": "set_max_num_seqs", "max_num_seqs": 32},
                   headers=OPS).json()
    assert mixed["kind"] == "lower_max_num_seqs"


def test_a_live_canary_is_judged_beside_its_peers_then_rolled_to_them_and_nothing_restarts(
        c: TestClient, clock: FakeClock) -> None:
    send(c, 1, live("r0"), live("r1"), live("r2"))
    action = c.post("/v1/models/tiny-llama/actions", json={"kind": "set_max_num_seqs", "max_num_seqs": 32},
                    headers=OPS).json()
    assert action["kind"] == "set_live_cap"
    seq = 1
    asked = {"r0": 32, "r1": None, "r2": None}
    # The canary's agent writes the cap; then two minutes of readings (the canary window), every ten seconds.
    for _ in range(14):
        seq += 1
        desired = send(c, seq, *(live(n, asked=a) for n, a in asked.items()))
        assert all(s["generation"] == 1 for s in desired.values())  # never a restart
        reconcile_now(c)
        clock.advance(10)
    state = c.get(f"/v1/actions/{action['id']}", headers=OPS).json()
    plan = state["params"]["rollout"]
    assert plan["phase"] == "rolling" and plan["canary_verdict"]["verdict"] == "pass", plan
    # The peers take it together: their agents are told at the same generation.
    seq += 1
    desired = send(c, seq, *(live(n, asked=a) for n, a in asked.items()))
    assert {n: s["live_cap"] for n, s in desired.items() if n != "r0"} == {"r1": 32, "r2": 32}
    assert all(s["generation"] == 1 for s in desired.values())
    seq += 1
    send(c, seq, *(live(n, asked=32) for n in asked))
    assert reconcile_now(c) == {action["id"]: "succeeded"}
    outcome = c.get(f"/v1/actions/{action['id']}", headers=OPS).json()["outcome"]
    assert outcome.startswith("3 replica(s) at live cap 32 with no restart"), outcome
