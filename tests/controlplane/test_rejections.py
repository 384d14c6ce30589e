"""Reports that must be refused are refused with the right status, and leave the stored fleet unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import T0, body, replica, report


def snapshot(client: TestClient) -> dict[str, Any]:
    return {path: client.get(path).json() for path in ("/v1/nodes", "/v1/replicas", "/v1/gpus", "/v1/events")}


@pytest.fixture
def seeded(client: TestClient) -> TestClient:
    assert client.post("/v1/agents/gpu-a/report", json=body(report())).status_code == 200
    return client


def newer() -> dict[str, Any]:
    """A report that would change the fleet if it were accepted."""
    return body(report(sequence=2, sent_at=T0 + timedelta(seconds=5), replicas=[replica("r9")]))


def with_(data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**data, **changes}


@pytest.mark.parametrize(("case", "status", "needle"), [
    ("bad field type", 422, "sequence"),
    ("unknown field", 422, "surprise"),
    ("replica name with a slash", 422, "name"),
    ("not json", 422, "not JSON"),
    ("same replica twice", 422, "replica name repeated in one report: r9"),
    ("wrong node in path", 400, "gpu-b"),
    ("unsupported protocol", 400, "speaks 1"),
    ("oversized", 413, "larger than"),
])
def test_refused_report_leaves_fleet_unchanged(seeded: TestClient, case: str, status: int, needle: str) -> None:
    before = snapshot(seeded)
    data = newer()
    path, content = "/v1/agents/gpu-a/report", None
    if case == "bad field type":
        data = with_(data, sequence="many")
    elif case == "unknown field":
        data = with_(data, surprise=1)
    elif case == "replica name with a slash":
        data["replicas"][0]["name"] = "r/0"
    elif case == "same replica twice":
        data["replicas"] = data["replicas"] * 2
    elif case == "not json":
        content = b"{nope"
    elif case == "wrong node in path":
        path = "/v1/agents/gpu-b/report"
    elif case == "unsupported protocol":
        data = with_(data, protocol_version=2, field_from_the_future=True)
    elif case == "oversized":
        data["replicas"][0]["log_tail"] = ["x" * 200] * 200
        data["events"] = [{"replica": "r9", "at": T0.isoformat(), "kind": "noise", "message": "y" * 4000}] * 300
    payload = content if content is not None else json.dumps(data).encode()
    response = seeded.post(path, content=payload, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert needle in json.dumps(response.json())
    assert snapshot(seeded) == before
    metrics = seeded.get("/metrics").text
    assert 'pitstop_cp_reports_received_total{outcome="new"} 1.0' in metrics


def test_oversized_without_content_length_is_refused_while_streaming(seeded: TestClient) -> None:
    before = snapshot(seeded)

    def chunks() -> Iterator[bytes]:
        yield b'{"protocol_version": 1, "node": "gpu-a", "padding": "'
        for _ in range(300):
            yield b"z" * 4096
        yield b'"}'

    response = seeded.post("/v1/agents/gpu-a/report", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert snapshot(seeded) == before


def test_rejections_are_counted_by_reason(seeded: TestClient) -> None:
    seeded.post("/v1/agents/gpu-b/report", json=newer())
    seeded.post("/v1/agents/gpu-a/report", json=with_(newer(), protocol_version=9))
    metrics = seeded.get("/metrics").text
    assert 'pitstop_cp_reports_rejected_total{reason="node_mismatch"} 1.0' in metrics
    assert 'pitstop_cp_reports_rejected_total{reason="protocol_version"} 1.0' in metrics
    assert 'pitstop_cp_reports_rejected_total{reason="malformed"} 0.0' in metrics


@pytest.fixture
def guarded(db_url: str, clock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, agent_tokens=["agent-secret", "agent-next"],
                          viewer_tokens=["look"], operator_tokens=["ops"])
    with TestClient(create_app(config, clock=clock)) as c:
        yield c


def test_agent_token_enforced_when_configured(guarded: TestClient) -> None:
    url, data = "/v1/agents/gpu-a/report", body(report())
    assert guarded.post(url, json=data).status_code == 401
    assert guarded.post(url, json=data, headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert guarded.post(url, json=data, headers={"Authorization": "Bearer look"}).status_code == 403
    assert guarded.get("/v1/nodes", headers={"Authorization": "Bearer ops"}).json() == []
    # A second configured token works too, so tokens can be rotated without a flag day.
    assert guarded.post(url, json=data, headers={"Authorization": "Bearer agent-next"}).status_code == 200
    metrics = guarded.get("/metrics").text
    assert 'pitstop_cp_reports_rejected_total{reason="unauthorized"} 1.0' in metrics
    assert 'pitstop_cp_reports_rejected_total{reason="forbidden"} 2.0' in metrics


def test_read_tokens_enforced_when_configured(guarded: TestClient) -> None:
    assert guarded.get("/v1/nodes").status_code == 401
    assert guarded.get("/v1/nodes", headers={"Authorization": "Bearer agent-secret"}).status_code == 403
    assert guarded.get("/v1/replicas", headers={"Authorization": "Bearer look"}).status_code == 200
    # Probes and scrapes stay open: load balancers and Prometheus carry no token.
    assert guarded.get("/healthz").status_code == 200 and guarded.get("/readyz").status_code == 200


def _event(at: str) -> dict[str, Any]:
    return {"replica": "r9", "at": at, "kind": "transition", "from_state": "WARMING", "to_state": "READY"}


YEAR_AHEAD = (T0 + timedelta(days=365)).isoformat()
# Each case: what is changed in an otherwise good report, and the field the refusal must name.
IMPOSSIBLE = {
    # Once 500s: a naive time, integers past their columns, a version that is not a number.
    "naive sent_at": (lambda d: d.update(sent_at="2026-11-29T12:00:05"), "sent_at"),
    "naive state_since": (lambda d: d["replicas"][0].update(state_since="2026-11-29T11:55:00"),
                          "replicas.0.state_since"),
    "naive event time": (lambda d: d.update(events=[_event("2026-11-29T11:59:00")]), "events.0.at"),
    "generation past 64 bits": (lambda d: d["replicas"][0].update(generation=2**64), "replicas.0.generation"),
    "generation past its INTEGER column": (lambda d: d["replicas"][0].update(generation=2**31),
                                           "replicas.0.generation"),
    "restarts past 64 bits": (lambda d: d["replicas"][0].update(restarts_total=2**70), "replicas.0.restarts_total"),
    "exit code past 64 bits": (lambda d: d["replicas"][0].update(last_exit_code=-(2**64)),
                               "replicas.0.last_exit_code"),
    "host memory past 64 bits": (lambda d: d.update(memory_total_bytes=2**64), "memory_total_bytes"),
    "GPU memory past 64 bits": (lambda d: d["gpus"][0].update(memory_used_bytes=10**30), "gpus.0.memory_used_bytes"),
    "protocol_version an object": (lambda d: d.update(protocol_version={}), "protocol_version"),
    "protocol_version a string": (lambda d: d.update(protocol_version="1"), "protocol_version"),
    # Stored and then acted on, once.
    "negative requests running": (lambda d: d["replicas"][0]["engine"].update(requests_running=-3),
                                  "replicas.0.engine.requests_running"),
    "negative token rate": (lambda d: d["replicas"][0]["engine"].update(generation_tokens_per_second=-1.5),
                            "replicas.0.engine.generation_tokens_per_second"),
    "negative p99": (lambda d: d["replicas"][0]["engine"].update(ttft_p99_seconds=-0.1),
                     "replicas.0.engine.ttft_p99_seconds"),
    "negative token total": (lambda d: d["replicas"][0]["engine"].update(generation_tokens_total=-10),
                             "replicas.0.engine.generation_tokens_total"),
    "KV cache over full": (lambda d: d["replicas"][0]["engine"].update(kv_cache_usage_ratio=1.5),
                           "replicas.0.engine.kv_cache_usage_ratio"),
    "replica on a GPU the node lacks": (lambda d: d["replicas"][0].update(gpus=[99]), "replicas.0.gpus"),
    "replica on GPU -1": (lambda d: d["replicas"][0].update(gpus=[-1]), "replicas.0.gpus.0"),
    "event a year ahead": (lambda d: d.update(events=[_event(YEAR_AHEAD)]), "events.0.at"),
    "state_since a year ahead": (lambda d: d["replicas"][0].update(state_since=YEAR_AHEAD),
                                 "replicas.0.state_since"),
    "GPU at a million degrees": (lambda d: d["gpus"][0].update(temperature_celsius=1e6),
                                 "gpus.0.temperature_celsius"),
    "GPU below -50 degrees": (lambda d: d["gpus"][0].update(slowdown_temperature_celsius=-300),
                              "gpus.0.slowdown_temperature_celsius"),
    "negative power": (lambda d: d["gpus"][0].update(power_watts=-5.0), "gpus.0.power_watts"),
    "a megawatt GPU": (lambda d: d["gpus"][0].update(power_limit_watts=1e6), "gpus.0.power_limit_watts"),
    "negative canary time": (lambda d: d["replicas"][0].update(canary_ttft_seconds=-1),
                             "replicas.0.canary_ttft_seconds"),
}
# Numbers JSON can carry and Python reads as infinity or NaN: written into the body's text.
NON_FINITE = {
    "1e309 read back as infinity": ("1e309", "gpus.0.temperature_celsius"),
    "NaN": ("NaN", "gpus.0.temperature_celsius"),
    "-Infinity": ("-Infinity", "gpus.0.temperature_celsius"),
}


def _locs(response: Any) -> list[str]:
    detail = response.json()["detail"]
    assert isinstance(detail, list), detail
    return [".".join(str(part) for part in problem["loc"]) for problem in detail]


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
def test_impossible_or_unstorable_values_are_refused_naming_the_field(seeded: TestClient, case: str) -> None:
    before = snapshot(seeded)
    data = newer()
    change, field = IMPOSSIBLE[case]
    change(data)
    response = seeded.post("/v1/agents/gpu-a/report", json=data)
    assert response.status_code == 422, response.text
    assert field in _locs(response), response.text
    assert snapshot(seeded) == before


@pytest.mark.parametrize("case", list(NON_FINITE))
def test_non_finite_numbers_are_refused_naming_the_field(seeded: TestClient, case: str) -> None:
    before = snapshot(seeded)
    data = newer()
    data["gpus"][0]["temperature_celsius"] = 61.25
    text, field = NON_FINITE[case]
    content = json.dumps(data).replace("61.25", text).encode()
    response = seeded.post("/v1/agents/gpu-a/report", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert field in _locs(response)
    assert "finite" in response.text
    assert snapshot(seeded) == before


def test_the_bounds_the_control_plane_enforces_are_in_its_openapi_document(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    temperature = schemas["GpuSample"]["properties"]["temperature_celsius"]["anyOf"][0]
    assert (temperature["minimum"], temperature["maximum"]) == (-50, 200)
    assert schemas["ReplicaStatus"]["properties"]["generation"]["maximum"] == 2**31 - 1
    assert schemas["ReplicaStatus"]["properties"]["gpus"]["items"] == {"maximum": 1023, "minimum": 0,
                                                                        "type": "integer"}
