"""The control plane with an SGLang model beside a vLLM one: stored, summarised and governed by its own flag."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from agent.wire import ReplicaStatus
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import FakeClock, body, replica, report

OPS = {"Authorization": "Bearer ops"}
AGENT = {"Authorization": "Bearer agent"}


@pytest.fixture
def c(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, operator_tokens=["ops"], agent_tokens=["agent"],
                          guardrails={"budget": {"min_ready": 1, "min_ready_ratio": 0.5}})
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        yield client


def sglang(name: str, limit: int | None = 48) -> ReplicaStatus:
    args = ["--model-path", "/models/qwen", "--tp-size", "1"] + ([] if limit is None else
                                                                  ["--max-running-requests", str(limit)])
    return replica(name, model="qwen").model_copy(update={"engine_kind": "sglang", "engine_args": args})


def test_an_sglang_model_is_stored_summarised_and_changed_with_its_own_flag(c: TestClient) -> None:
    sent = report("gpu-a", sequence=1, replicas=[replica("v0"), sglang("s0"), sglang("s1")])
    assert c.post("/v1/agents/gpu-a/report", json=body(sent), headers=AGENT).status_code == 200
    rows = {r["name"]: r for r in c.get("/v1/replicas", headers=OPS).json()}
    assert rows["s0"]["engine_kind"] == "sglang" and rows["v0"]["engine_kind"] == "vllm"
    models = {m["model"]: m for m in c.get("/v1/summary", headers=OPS).json()["models"]}
    assert models["qwen"]["engines"] == ["sglang"] and models["qwen"]["governed_flag"] == "--max-running-requests"
    assert models["tiny-llama"]["governed_flag"] == "--max-num-seqs"
    path = "/v1/models/qwen/actions"
    same = c.post(path, json={"kind": "set_max_num_seqs", "max_num_seqs": 48}, headers=OPS)
    assert same.status_code == 409 and "already runs --max-running-requests 48" in same.json()["detail"]
    made = c.post(path, json={"kind": "set_max_num_seqs", "max_num_seqs": 24}, headers=OPS)
    assert made.status_code == 201, made.text
    action = made.json()
    assert action["kind"] == "lower_max_num_seqs" and action["params"]["flag"] == "--max-running-requests"
    [args] = action["params"]["engine_args"].values()
    assert args[-2:] == ["--max-running-requests", "24"] and "--max-num-seqs" not in args


def test_an_sglang_replica_without_the_flag_has_no_value_to_change_from(c: TestClient) -> None:
    sent = report("gpu-a", sequence=1, replicas=[sglang("s0", limit=None)])
    assert c.post("/v1/agents/gpu-a/report", json=body(sent), headers=AGENT).status_code == 200
    answer = c.post("/v1/models/qwen/actions", json={"kind": "set_max_num_seqs", "max_num_seqs": 24}, headers=OPS)
    assert answer.status_code == 409
    assert "runs SGLang with no --max-running-requests" in answer.json()["detail"]
