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
