"""``GET /v1/summary``: what on-call reads first, per model against the shipped policies' SLO targets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agent.wire import EngineSample, ReplicaState, ReplicaStatus
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import FakeClock, body, replica, report

AGENT = {"Authorization": "Bearer agent"}
VIEWER = {"Authorization": "Bearer look"}
OPS = {"Authorization": "Bearer ops"}


@pytest.fixture
def c(db_url: str, clock: FakeClock, tmp_path: Path) -> Iterator[TestClient]:
    extra = tmp_path / "policies"
    extra.mkdir()
    (extra / "careful.yaml").write_text(
        "name: careful-restart\ncondition: {signal: kv_cache_usage_ratio, op: '>', threshold: 0.99, for: 1m}\n"
        "action: {kind: restart}\nguardrails: {dry_run: true}\n")
    config = ServerConfig(database_url=db_url, agent_tokens=["agent"], viewer_tokens=["look"],
                          operator_tokens=["ops"], policy_dirs=[str(extra)], stale_after_seconds=60)
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        yield client


def send(c: TestClient, seq: int, *replicas: ReplicaStatus, node: str = "gpu-a") -> None:
    r = report(node, sequence=seq, replicas=list(replicas), sent_at=c.app.state.pitstop.clock())  # type: ignore[attr-defined]
    assert c.post(f"/v1/agents/{node}/report", json=body(r), headers=AGENT).status_code == 200


def busy(name: str, *, ttft: float = 0.12, itl: float | None = 0.021, rps: float = 10.0, errors: float = 0.0,
         model: str = "tiny-llama") -> ReplicaStatus:
    r = replica(name, model=model)
    engine = EngineSample(requests_running=3, ttft_p99_seconds=ttft, itl_p99_seconds=itl, requests_per_second=rps,
                          errors_per_second=errors, generation_tokens_per_second=250.0)
    return r.model_copy(update={"engine": engine})


def summary(c: TestClient) -> dict[str, Any]:
    got = c.get("/v1/summary", headers=VIEWER)
    assert got.status_code == 200, got.text
    out: dict[str, Any] = got.json()
    return out


def objectives(model: dict[str, Any]) -> dict[str, tuple[Any, Any, Any, Any]]:
    return {o["name"]: (o["value"], o["target"], o["policy"], o["status"]) for o in model["objectives"]}


def test_an_empty_fleet_has_nothing_to_colour(c: TestClient) -> None:
    got = summary(c)
    assert got["models"] == [] and got["nodes"] == {"total": 0, "up": 0, "stale": 0, "cordoned": 0}
    assert got["alerts_firing"] == 0 and got["recent_actions"] == []
    assert got["automation"]["policies_enabled"] and not got["automation"]["breaker"]["tripped"]
    assert got["automation"]["dry_run"] == ["careful-restart"]


def test_each_model_is_judged_against_the_policies_that_act_on_it(c: TestClient) -> None:
    send(c, 1, busy("r0"), busy("r1", ttft=0.45), busy("m0", model="mistral-7b", ttft=0.9, itl=None),
         replica("r2", state=ReplicaState.STARTING))
    mistral, llama = summary(c)["models"]  # by name
    assert (llama["model"], llama["replicas"], llama["ready"]) == ("tiny-llama", 3, 2)
    assert llama["by_state"] == {"READY": 2, "STARTING": 1}
    assert llama["tokens_per_second"] == 500.0 and llama["requests_per_second"] == 20.0
    # The worst READY replica's p99 against ttft-slo's 500 ms: 450 ms is within 80 % of it, amber.
    assert objectives(llama) == {"ttft_p99": (0.45, 0.5, "ttft-slo", "amber"),
                                 "itl_p99": (0.021, 0.2, "itl-slo", "green"),
                                 "error_ratio": (0.0, 0.001, "error-rate", "green")}
    assert llama["status"] == "amber"
    assert objectives(mistral)["ttft_p99"][3] == "red" and objectives(mistral)["itl_p99"] == (None, 0.2, "itl-slo",
                                                                                               "unknown")
    assert mistral["status"] == "red"


def test_a_model_with_a_replica_down_is_amber_and_with_none_serving_red(c: TestClient) -> None:
    send(c, 1, busy("r0"), busy("r1"), replica("r2", state=ReplicaState.WEDGED))
    [llama] = summary(c)["models"]
    assert all(o["status"] == "green" for o in llama["objectives"]), "the two serving replicas meet the SLOs"
    assert (llama["capacity"], llama["status"]) == ("amber", "amber")
    send(c, 2, replica("r0", state=ReplicaState.BACKOFF), replica("r1", state=ReplicaState.STARTING))
    [llama] = summary(c)["models"]
    assert (llama["ready"], llama["capacity"], llama["status"]) == (0, "red", "red")


def test_errors_are_summed_over_the_models_replicas(c: TestClient) -> None:
    send(c, 1, busy("r0", rps=10.0, errors=0.02), busy("r1", rps=10.0, errors=0.0))
    [llama] = summary(c)["models"]
    value, target, policy, status = objectives(llama)["error_ratio"]
    assert value == pytest.approx(0.001) and (target, policy) == (0.001, "error-rate") and status == "amber"


def test_a_stale_nodes_replicas_do_not_count_as_serving(c: TestClient, clock: FakeClock) -> None:
    send(c, 1, busy("r0"), busy("r1"))
    send(c, 1, busy("r2", ttft=2.0), node="gpu-b")
    assert summary(c)["models"][0]["ready"] == 3
    clock.advance(120)
    send(c, 2, busy("r0"), busy("r1"))  # gpu-b has gone quiet
    got = summary(c)
    assert got["nodes"] == {"total": 2, "up": 1, "stale": 1, "cordoned": 0}
    [llama] = got["models"]
    assert llama["ready"] == 2 and objectives(llama)["ttft_p99"][0] == 0.12, "its old 2 s p99 is not news"


def test_the_last_actions_come_newest_first_with_their_state(c: TestClient) -> None:
    send(c, 1, busy("r0"), busy("r1"), busy("r2"))
    first = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=OPS).json()
    second = c.post("/v1/replicas/gpu-a/r1/actions", json={"kind": "drain"}, headers=OPS).json()
    recent = summary(c)["recent_actions"]
    assert [(a["id"], a["kind"], a["requested_by"]) for a in recent] == [
        (second["id"], "drain", second["requested_by"]), (first["id"], "restart", first["requested_by"])]
    assert c.get("/v1/summary", params={"actions": 1}, headers=VIEWER).json()["recent_actions"][0]["id"] == second["id"]
    assert c.get("/v1/summary").status_code == 401
