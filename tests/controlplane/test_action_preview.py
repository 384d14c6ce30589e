"""``?dry_run=true`` on every operator action: the guardrails' decision and the blast radius, nothing recorded."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agent.wire import ReplicaState
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.remediation.executor import reconcile
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import FakeClock, body, replica, report

OPS = {"Authorization": "Bearer ops"}
ADMIN = {"Authorization": "Bearer root"}
AGENT = {"Authorization": "Bearer agent"}
VIEWER = {"Authorization": "Bearer look"}


@pytest.fixture
def c(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    # The configured budget (2 READY of any model) is the one an operator's request is judged by.
    config = ServerConfig(database_url=db_url, operator_tokens=["ops"], admin_tokens=["root"],
                          agent_tokens=["agent"], viewer_tokens=["look"],
                          guardrails={"budget": {"min_ready": 2, "min_ready_ratio": 0.5}})
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        yield client


def send(c: TestClient, seq: int, *replicas: object, node: str = "gpu-a") -> None:
    r = report(node, sequence=seq, replicas=list(replicas))  # type: ignore[arg-type]
    assert c.post(f"/v1/agents/{node}/report", json=body(r), headers=AGENT).status_code == 200


def preview(c: TestClient, path: str, payload: dict[str, Any], headers: dict[str, str] = OPS) -> dict[str, Any]:
    got = c.post(path, params={"dry_run": "true"}, json=payload, headers=headers)
    assert got.status_code == 200, got.text
    out: dict[str, Any] = got.json()
    return out


def test_a_dry_run_shows_what_a_restart_takes_out_and_records_nothing(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"), replica("r2"))
    seen = preview(c, "/v1/replicas/gpu-a/r1/actions", {"kind": "restart"})
    assert seen["verdict"] == "allowed" and seen["state"] == "approved"
    assert seen["summary"] == "restarts 1 of 3 READY replicas of tiny-llama; 2 stay serving"
    assert seen["impact"] == [{"model": "tiny-llama", "replicas": 3, "ready": 3, "out_at_once": 1,
                               "stay_serving": 2, "floor": 2}]
    assert c.get("/v1/actions", headers=OPS).json() == []
    assert c.get("/v1/audit", headers=ADMIN).json() == []
    assert c.get("/v1/desired", headers=OPS).json() == []


def test_a_dry_run_says_when_the_budget_would_hold_the_action(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"), replica("r2", state=ReplicaState.STARTING))
    seen = preview(c, "/v1/replicas/gpu-a/r0/actions", {"kind": "drain"})
    assert (seen["verdict"], seen["guardrail"], seen["state"]) == ("suppressed", "disruption_budget", "suppressed")
    assert seen["summary"].startswith("held by the disruption budget: tiny-llama: 1 of 3 replicas would stay READY")
    assert seen["summary"].endswith("otherwise it drains 1 of 2 READY replicas of tiny-llama; 1 stay serving")
    # An admin's force would bypass it: the preview says it would be recorded as approved.
    forced = preview(c, "/v1/replicas/gpu-a/r0/actions", {"kind": "drain", "force": True}, ADMIN)
    assert forced["forced"] is True and forced["state"] == "approved" and "with force it drains" in forced["summary"]
    # The real request is held exactly as previewed.
    held = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "drain"}, headers=OPS).json()
    assert held["state"] == "suppressed" and "budget needs 2" in held["guardrails"][0]["reason"]


def test_a_models_rolling_restart_previews_its_batches_and_refuses_a_second_one(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"), replica("r2"))
    seen = preview(c, "/v1/models/tiny-llama/actions", {"kind": "rolling_restart"})
    assert seen["replicas"] == ["gpu-a/r0", "gpu-a/r1", "gpu-a/r2"]
    assert seen["summary"] == "restarts 3 replicas of tiny-llama, 1 at a time; 2 of 3 stay serving throughout"
    first = c.post("/v1/models/tiny-llama/actions", json={"kind": "rolling_restart"}, headers=OPS)
    assert first.status_code == 201
    again = c.post("/v1/models/tiny-llama/actions", json={"kind": "rolling_restart"}, headers=OPS)
    assert again.status_code == 409
    assert f"already running (action {first.json()['id']})" in again.json()["detail"]
    assert c.post("/v1/models/tiny-llama/actions", params={"dry_run": "true"}, json={"kind": "rolling_restart"},
                  headers=OPS).status_code == 409


def test_a_node_cordon_preview_counts_every_model_it_drains(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1", model="mistral-7b"))
    send(c, 1, replica("r2"), replica("r3", model="mistral-7b"), node="gpu-b")
    seen = preview(c, "/v1/nodes/gpu-a/actions", {"kind": "cordon"})
    assert seen["replicas"] == ["gpu-a/r0", "gpu-a/r1"]
    assert seen["summary"] == ("fences gpu-a and drains 2 replicas (mistral-7b: 1 of 2 stay serving; "
                               "tiny-llama: 1 of 2 stay serving)")
    back = preview(c, "/v1/nodes/gpu-a/actions", {"kind": "uncordon"})
    assert back["summary"] == "gives gpu-a back to the scheduler; nothing stops"


def test_a_viewer_gets_no_preview_and_unknown_targets_are_404(c: TestClient) -> None:
    send(c, 1, replica("r0"))
    assert c.post("/v1/replicas/gpu-a/r0/actions", params={"dry_run": "true"}, json={"kind": "restart"},
                  headers=VIEWER).status_code == 403
    assert c.post("/v1/models/nope/actions", params={"dry_run": "true"}, json={"kind": "rolling_restart"},
                  headers=OPS).status_code == 404
    assert c.post("/v1/replicas/gpu-a/zz/actions", params={"dry_run": "true"}, json={"kind": "restart"},
                  headers=OPS).status_code == 404


def test_an_operator_sets_max_num_seqs_on_a_canary_first(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"), replica("r2"))  # each runs --max-num-seqs 64
    body = {"kind": "set_max_num_seqs", "max_num_seqs": 32, "canary": "gpu-a/r1"}
    seen = preview(c, "/v1/models/tiny-llama/actions", body)
    assert (seen["kind"], seen["target"], seen["replicas"]) == ("lower_max_num_seqs", "replica:gpu-a/r1", ["gpu-a/r1"])
    assert seen["summary"].startswith("tries --max-num-seqs 32 (now 64) on gpu-a/r1 first: restarts 1 of 3 READY")
    made = c.post("/v1/models/tiny-llama/actions", json=body, headers=OPS)
    assert made.status_code == 201, made.text
    action = made.json()
    assert action["params"]["canary"] is True and action["params"]["previous"] == 64
    assert action["params"]["judge"]["latencies"] == ["itl_p99_seconds"]
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    with session_scope(ctx.sessions) as session:
        reconcile(session=session, now=ctx.clock(), deadline=timedelta(seconds=300))
    desired = {d["name"]: d for d in c.get("/v1/desired", headers=OPS).json()}
    assert list(desired) == ["r1"], "only the canary moves first"
    assert desired["r1"]["engine_args"][-2:] == ["--max-num-seqs", "32"]
    # One change of a model's flags at a time, and nothing to do when the value is already there.
    again = c.post("/v1/models/tiny-llama/actions", json={**body, "max_num_seqs": 16}, headers=OPS)
    assert again.status_code == 409 and f"(action {action['id']})" in again.json()["detail"]


def test_a_max_num_seqs_request_is_checked_before_anything_moves(c: TestClient) -> None:
    send(c, 1, replica("r0"), replica("r1"))
    path = "/v1/models/tiny-llama/actions"
    assert c.post(path, json={"kind": "set_max_num_seqs"}, headers=OPS).status_code == 422
    same = c.post(path, json={"kind": "set_max_num_seqs", "max_num_seqs": 64}, headers=OPS)
    assert same.status_code == 409 and "already runs --max-num-seqs 64" in same.json()["detail"]
    assert c.post(path, json={"kind": "set_max_num_seqs", "max_num_seqs": 32, "canary": "gpu-a/zz"},
                  headers=OPS).status_code == 404
    assert c.post(path, json={"kind": "set_max_num_seqs", "max_num_seqs": 32}, headers=VIEWER).status_code == 403
    raised = preview(c, path, {"kind": "set_max_num_seqs", "max_num_seqs": 128})
    assert raised["kind"] == "raise_max_num_seqs" and raised["target"] == "replica:gpu-a/r0"


def test_a_replica_back_from_a_restart_counts_as_serving_only_once_it_has_settled(
        c: TestClient, clock: FakeClock) -> None:
    # Two of three must serve. r0 is restarted and comes back READY; behind a load balancer it is not yet in
    # rotation, so restarting r1 at once would leave r2 serving alone.
    send(c, 1, replica("r0"), replica("r1"), replica("r2"))
    made = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=OPS).json()
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]

    def reconcile_now() -> None:
        with session_scope(ctx.sessions) as session:
            reconcile(session=session, now=clock(), deadline=timedelta(seconds=300))

    reconcile_now()
    clock.advance(20)
    send(c, 2, replica("r0").model_copy(update={"generation": 2}), replica("r1"), replica("r2"))
    reconcile_now()
    assert c.get(f"/v1/actions/{made['id']}", headers=OPS).json()["state"] == "succeeded"
    clock.advance(2)
    seen = preview(c, "/v1/replicas/gpu-a/r1/actions", {"kind": "restart"})
    assert (seen["verdict"], seen["guardrail"]) == ("suppressed", "disruption_budget")
    assert "gpu-a/r0 back within the last 5s, not yet counted" in seen["reason"]
    assert seen["impact"][0]["ready"] == 2  # r0 is not counted yet
    clock.advance(3)  # rollout_settle_seconds, 5 s by default, since the restart ended
    seen = preview(c, "/v1/replicas/gpu-a/r1/actions", {"kind": "restart"})
    assert seen["verdict"] == "allowed"
    assert seen["summary"] == "restarts 1 of 3 READY replicas of tiny-llama; 2 stay serving"
