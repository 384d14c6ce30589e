"""Alertmanager as an input: its webhook payload (version 4) becomes alert rows mapped to replicas, nodes and
models; repeats refresh, resolves close, and a refused payload is counted and stores nothing."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from sqlalchemy import func, select

from bench.harness.http import probe
from controlplane.api import alertmanager
from controlplane.api.app import create_app
from controlplane.cli import main
from controlplane.config import ServerConfig, load_config
from controlplane.notify import notifier
from controlplane.notify.config import NotifierConfig
from controlplane.notify.secrets import resolve_secrets
from controlplane.policy.snapshot import ALERTMANAGER_POLICY
from controlplane.remediation import alerting
from controlplane.remediation.snapshot import build_snapshot
from controlplane.store.db import session_scope
from controlplane.store.models import AlertRow, NotificationDelivery
from tests.controlplane.fixtures import T0, FakeClock, body, replica, report
from tests.helpers import free_port, http_ok, wait_until

AM, AGENT, VIEWER, OPERATOR = "am-secret", "agent-secret", "viewer-secret", "operator-secret"
SCHEMA = Path(__file__).parents[1] / "notify" / "schemas" / "alertmanager_webhook_v4.json"
ALERTMANAGER_BINARY = "/usr/bin/prometheus-alertmanager"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fleet_report() -> dict[str, Any]:
    """Node gpu-a with r0 (tiny-llama) and r1 (qwen-7b, its engine at 10.0.0.5:8001)."""
    r1 = replica("r1", model="qwen-7b").model_copy(update={"url": "http://10.0.0.5:8001"})
    return body(report(replicas=[replica("r0"), r1]))


@pytest.fixture
def am_client(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=db_url, alertmanager_tokens=[AM], agent_tokens=[AGENT],
                          viewer_tokens=[VIEWER], operator_tokens=[OPERATOR])
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as c:
        assert c.post("/v1/agents/gpu-a/report", json=fleet_report(), headers=bearer(AGENT)).status_code == 200
        yield c


def am_alert(labels: dict[str, str], *, fingerprint: str, starts: str = "2026-11-29T11:58:30.123456789Z",
             status: str = "firing", ends: str = "0001-01-01T00:00:00Z") -> dict[str, Any]:
    return {"status": status, "labels": labels,
            "annotations": {"summary": f"{labels.get('alertname')} is firing", "runbook_url": "https://rb/x"},
            "startsAt": starts, "endsAt": ends,
            "generatorURL": "http://prometheus.example:9090/graph?g0.expr=ttft%3E1&g0.tab=1",
            "fingerprint": fingerprint}


def payload(*alerts: dict[str, Any], status: str = "firing") -> dict[str, Any]:
    """The body as Alertmanager 0.25 posts it (its field order, ``truncatedAlerts`` included)."""
    common = dict(alerts[0]["labels"]) if len(alerts) == 1 else {}
    return {
        "receiver": "pitstop", "status": status, "alerts": list(alerts),
        "groupLabels": {"alertname": alerts[0]["labels"].get("alertname", "")}, "commonLabels": common,
        "commonAnnotations": {}, "externalURL": "http://alertmanager.example:9093", "version": "4",
        "groupKey": '{}:{alertname="TTFTHigh"}', "truncatedAlerts": 0,
    }


TTFT_ON_R0 = am_alert({"alertname": "TTFTHigh", "node": "gpu-a", "replica": "r0", "model": "tiny-llama",
                       "severity": "critical", "instance": "gpu-a.example:9400", "job": "pitstop-agent"},
                      fingerprint="5f3c0d2a9b8e7f61")


def a_mixed_group() -> dict[str, Any]:
    return payload(
        TTFT_ON_R0,
        am_alert({"alertname": "GpuHot", "node": "gpu-a", "gpu": "0", "severity": "warning"},
                 fingerprint="a1b2c3d4e5f60718"),
        am_alert({"alertname": "KVCacheFull", "model_name": "qwen-7b", "job": "vllm"}, fingerprint="0f0e0d0c0b0a0908"),
        am_alert({"alertname": "EngineDown", "instance": "10.0.0.5:8001", "job": "vllm"},
                 fingerprint="1122334455667788"),
        am_alert({"alertname": "DiskFull", "instance": "db-7.example:9100", "job": "node"},
                 fingerprint="99aabbccddeeff00"),
    )


def stored(client: TestClient) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = client.get("/v1/alerts", headers=bearer(VIEWER)).json()
    return sorted(alerts, key=lambda a: a["id"])


def rows(client: TestClient) -> int:
    with session_scope(client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        return int(session.scalar(select(func.count()).select_from(AlertRow)) or 0)


def metric(client: TestClient, line: str) -> float:
    for text in client.get("/metrics").text.splitlines():
        if text.startswith(line + " "):
            return float(text.rsplit(" ", 1)[1])
    raise AssertionError(f"{line} not in /metrics")


def test_the_test_payload_is_what_alertmanager_sends() -> None:
    Draft202012Validator(json.loads(SCHEMA.read_text())).validate(a_mixed_group())


def test_each_alert_maps_to_its_replica_node_or_model_and_the_unmapped_one_is_kept(am_client: TestClient) -> None:
    data = a_mixed_group()
    data["alerts"][0]["notification_reason"] = "a field from a newer Alertmanager"
    answer = am_client.post("/v1/alertmanager", json=data, headers=bearer(AM))
    assert answer.status_code == 200, answer.text
    receipt = answer.json()
    assert (receipt["received"], receipt["mapped"], receipt["unmapped"], receipt["created"]) == (5, 4, 1, 5)
    assert [a["target"] for a in receipt["alerts"]] == [
        "replica:gpu-a/r0", "node:gpu-a", "model:qwen-7b", "replica:gpu-a/r1", "unmapped"]
    alerts = stored(am_client)
    assert [(a["labels"]["alertname"], a["labels"]["target"], a["state"], a["policy"]) for a in alerts] == [
        ("TTFTHigh", "replica:gpu-a/r0", "firing", ALERTMANAGER_POLICY),
        ("GpuHot", "node:gpu-a", "firing", ALERTMANAGER_POLICY),
        ("KVCacheFull", "model:qwen-7b", "firing", ALERTMANAGER_POLICY),
        ("EngineDown", "replica:gpu-a/r1", "firing", ALERTMANAGER_POLICY),
        ("DiskFull", "unmapped", "firing", ALERTMANAGER_POLICY),
    ]
    ttft = alerts[0]
    assert ttft["fingerprint"] == "5f3c0d2a9b8e7f61" and ttft["severity"] == "critical"
    assert ttft["labels"]["instance"] == "gpu-a.example:9400" and ttft["labels"]["replica"] == "r0"
    assert ttft["annotations"] == {"summary": "TTFTHigh is firing", "runbook_url": "https://rb/x",
                                   "generator_url": TTFT_ON_R0["generatorURL"]}
    assert datetime.fromisoformat(ttft["starts_at"]) == datetime(2026, 11, 29, 11, 58, 30, 123456, tzinfo=UTC)
    assert ttft["ends_at"] is None and ttft["action_id"] is None
    assert metric(am_client, 'pitstop_cp_alertmanager_alerts_total{target="unmapped"}') == 1
    assert metric(am_client, 'pitstop_cp_alertmanager_alerts_total{target="replica"}') == 2


def test_a_node_is_also_known_by_its_hostname_and_a_replica_label_pitstop_lacks_maps_to_nothing(
        am_client: TestClient) -> None:
    data = payload(am_alert({"alertname": "NodeHot", "node": "gpu-a.example"}, fingerprint="01"),
                   am_alert({"alertname": "TTFTHigh", "node": "gpu-a", "replica": "r9"}, fingerprint="02"),
                   am_alert({"alertname": "Other", "model": "no-such-model"}, fingerprint="03"),
                   am_alert({"alertname": "Agent", "instance": "gpu-a.example:9100"}, fingerprint="04"))
    receipt = am_client.post("/v1/alertmanager", json=data, headers=bearer(AM)).json()
    assert [a["target"] for a in receipt["alerts"]] == ["node:gpu-a", "unmapped", "unmapped", "node:gpu-a"]


def test_a_repeat_refreshes_the_same_rows(am_client: TestClient, clock: FakeClock) -> None:
    first = am_client.post("/v1/alertmanager", json=a_mixed_group(), headers=bearer(AM)).json()
    seen = stored(am_client)
    clock.advance(300)  # group_interval later, Alertmanager sends the group again
    again = am_client.post("/v1/alertmanager", json=a_mixed_group(), headers=bearer(AM)).json()
    assert (again["created"], again["updated"]) == (0, 5)
    assert [a["id"] for a in again["alerts"]] == [a["id"] for a in first["alerts"]]
    later = stored(am_client)
    assert len(later) == 5 and all(a["state"] == "firing" for a in later)
    assert [datetime.fromisoformat(a["last_seen_at"]) - datetime.fromisoformat(b["last_seen_at"])
            for a, b in zip(later, seen, strict=True)] == [timedelta(seconds=300)] * 5


def test_resolved_closes_the_alert_and_a_new_firing_is_a_new_alert(am_client: TestClient, clock: FakeClock) -> None:
    assert am_client.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(AM)).status_code == 200
    clock.advance(120)
    done = am_client.post("/v1/alertmanager", headers=bearer(AM), json=payload(
        {**TTFT_ON_R0, "status": "resolved", "endsAt": "2026-11-29T12:01:00.5Z"}, status="resolved")).json()
    assert (done["created"], done["updated"], done["resolved"]) == (0, 1, 1)
    [alert] = stored(am_client)
    assert alert["state"] == "resolved" and alert["resolved_reason"] == "resolved in Alertmanager"
    assert datetime.fromisoformat(alert["ends_at"]) == datetime(2026, 11, 29, 12, 1, 0, 500000, tzinfo=UTC)
    # The same alert firing again starts anew: a second row.
    anew = {**TTFT_ON_R0, "startsAt": "2026-11-29T12:10:00Z"}
    assert am_client.post("/v1/alertmanager", json=payload(anew), headers=bearer(AM)).json()["created"] == 1
    assert [a["state"] for a in stored(am_client)] == ["resolved", "firing"]


def test_a_newer_firing_ends_an_older_one_whose_resolve_was_lost(am_client: TestClient) -> None:
    am_client.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(AM))
    am_client.post("/v1/alertmanager", json=payload({**TTFT_ON_R0, "startsAt": "2026-11-29T12:10:00Z"}),
                   headers=bearer(AM))
    old, new = stored(am_client)
    assert (old["state"], new["state"]) == ("resolved", "firing")
    assert datetime.fromisoformat(old["ends_at"]) == datetime(2026, 11, 29, 12, 10, tzinfo=UTC)


def test_a_resolve_seen_first_is_kept_resolved(am_client: TestClient) -> None:
    gone = {**TTFT_ON_R0, "status": "resolved", "endsAt": "2026-11-29T12:00:00Z"}
    assert am_client.post("/v1/alertmanager", json=payload(gone), headers=bearer(AM)).json()["resolved"] == 1
    [alert] = stored(am_client)
    assert alert["state"] == "resolved"


def test_an_operator_resolution_holds_against_repeats(am_client: TestClient) -> None:
    am_client.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(AM))
    [alert] = stored(am_client)
    assert am_client.post(f"/v1/alerts/{alert['id']}/resolve", headers=bearer(OPERATOR)).status_code == 200
    am_client.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(AM))
    assert [a["state"] for a in stored(am_client)] == ["resolved"]


@pytest.mark.parametrize(("token", "code", "reason"), [
    (None, 401, "unauthorized"), ("not-a-token", 403, "forbidden"), (AGENT, 403, "forbidden"),
    (VIEWER, 403, "forbidden"), (OPERATOR, 403, "forbidden"),
])
def test_only_an_alertmanager_token_may_post(am_client: TestClient, token: str | None, code: int,
                                             reason: str) -> None:
    headers = bearer(token) if token else {}
    assert am_client.post("/v1/alertmanager", json=a_mixed_group(), headers=headers).status_code == code
    assert rows(am_client) == 0
    assert metric(am_client, f'pitstop_cp_alertmanager_rejected_total{{reason="{reason}"}}') == 1


def test_an_alertmanager_token_may_do_nothing_else(am_client: TestClient) -> None:
    assert am_client.get("/v1/nodes", headers=bearer(AM)).status_code == 403
    assert am_client.get("/v1/alerts", headers=bearer(AM)).status_code == 403
    assert am_client.post("/v1/agents/gpu-a/report", json=body(report(sequence=2)),
                          headers=bearer(AM)).status_code == 403


def test_open_mode_accepts_it_like_every_endpoint(db_url: str, clock: FakeClock) -> None:
    with TestClient(create_app(ServerConfig(database_url=db_url), clock=clock, run_jobs=False)) as c:
        answer = c.post("/v1/alertmanager", json=payload(TTFT_ON_R0))
        assert answer.status_code == 200 and answer.json()["unmapped"] == 1


def _malformed(case: str) -> bytes:
    data = payload(copy.deepcopy(TTFT_ON_R0))
    alert = data["alerts"][0]
    if case == "not json":
        return b'{"alerts": ['
    if case == "not an object":
        return b'[{"status": "firing"}]'
    if case == "no alerts":
        del data["alerts"]
    elif case == "alerts not a list":
        data["alerts"] = {"0": alert}
    elif case == "no startsAt":
        del alert["startsAt"]
    elif case == "zero startsAt":
        alert["startsAt"] = "0001-01-01T00:00:00Z"
    elif case == "startsAt without a zone":
        alert["startsAt"] = "2026-11-29T11:58:30"
    elif case == "startsAt not a time":
        alert["startsAt"] = "yesterday"
    elif case == "unknown status":
        alert["status"] = "pending"
    elif case == "label value not text":
        alert["labels"]["replica"] = 0
    elif case == "no labels":
        del alert["labels"]
    elif case == "fingerprint too long":
        alert["fingerprint"] = "f" * 65
    return json.dumps(data).encode()


@pytest.mark.parametrize("case", [
    "not json", "not an object", "no alerts", "alerts not a list", "no startsAt", "zero startsAt",
    "startsAt without a zone", "startsAt not a time", "unknown status", "label value not text", "no labels",
    "fingerprint too long",
])
def test_a_malformed_payload_is_422_counted_and_stores_nothing(am_client: TestClient, case: str) -> None:
    # A good alert first in the same payload: it must not be stored either.
    raw = _malformed(case)
    if case not in ("not json", "not an object"):
        data = json.loads(raw)
        if isinstance(data.get("alerts"), list):
            data["alerts"].insert(0, a_mixed_group()["alerts"][1])
        raw = json.dumps(data).encode()
    answer = am_client.post("/v1/alertmanager", content=raw,
                            headers={**bearer(AM), "content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert rows(am_client) == 0
    assert metric(am_client, 'pitstop_cp_alertmanager_rejected_total{reason="malformed"}') == 1
    assert "5f3c0d2a9b8e7f61" not in answer.text  # errors carry no input: labels may be sensitive


def test_another_payload_version_is_400(am_client: TestClient) -> None:
    data = {**payload(TTFT_ON_R0), "version": "5"}
    answer = am_client.post("/v1/alertmanager", json=data, headers=bearer(AM))
    assert answer.status_code == 400 and "version" in answer.text
    assert rows(am_client) == 0
    assert metric(am_client, 'pitstop_cp_alertmanager_rejected_total{reason="version"}') == 1


@pytest.mark.parametrize("version", [[], {}, 4])
def test_a_version_that_is_not_a_string_is_malformed_not_a_500(am_client: TestClient, version: object) -> None:
    # Found by fuzzing with the alertmanager token: a list was looked up in a set (TypeError: a 500).
    answer = am_client.post("/v1/alertmanager", json={**payload(TTFT_ON_R0), "version": version}, headers=bearer(AM))
    assert answer.status_code == 422, answer.text
    assert [e["loc"] for e in answer.json()["detail"]] == [["version"]]
    assert rows(am_client) == 0


def test_a_reported_url_that_is_no_url_maps_nothing_and_breaks_no_webhook(am_client: TestClient) -> None:
    # Found by fuzzing: a replica URL of "http://[oops" made every later payload a 500 (urlsplit raised).
    odd = replica("r2").model_copy(update={"url": "http://[oops"})
    r = report(sequence=2, sent_at=T0 + timedelta(seconds=5), replicas=[replica("r0"), odd])
    assert am_client.post("/v1/agents/gpu-a/report", json=body(r), headers=bearer(AGENT)).status_code == 200
    answer = am_client.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(AM))
    assert answer.status_code == 200, answer.text


def test_an_oversized_payload_is_refused_before_it_is_read(am_client: TestClient,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alertmanager, "MAX_PAYLOAD_BYTES", 4096)
    big = payload(*[am_alert({"alertname": "Noise", "i": str(i)}, fingerprint=f"{i:016x}") for i in range(40)])
    answer = am_client.post("/v1/alertmanager", json=big, headers=bearer(AM))
    assert answer.status_code == 413 and "larger than 4096" in answer.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while streaming
        raw = json.dumps(big).encode()
        for i in range(0, len(raw), 1000):
            yield raw[i:i + 1000]

    assert am_client.post("/v1/alertmanager", content=chunks(), headers=bearer(AM)).status_code == 413
    assert rows(am_client) == 0
    assert metric(am_client, 'pitstop_cp_alertmanager_rejected_total{reason="too_large"}') == 2


def test_the_default_limit_takes_a_large_group(am_client: TestClient) -> None:
    group = payload(*[am_alert({"alertname": "Noise", "i": str(i)}, fingerprint=f"{i:016x}") for i in range(2000)])
    assert len(json.dumps(group)) < alertmanager.MAX_PAYLOAD_BYTES
    assert am_client.post("/v1/alertmanager", json=group, headers=bearer(AM)).json()["unmapped"] == 2000


def test_the_snapshot_carries_the_firing_alertmanager_alerts(am_client: TestClient, clock: FakeClock) -> None:
    am_client.post("/v1/alertmanager", json=a_mixed_group(), headers=bearer(AM))
    gone = {**a_mixed_group()["alerts"][1], "status": "resolved", "endsAt": "2026-11-29T12:00:00Z"}
    am_client.post("/v1/alertmanager", json=payload(gone), headers=bearer(AM))
    with session_scope(am_client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        snap = build_snapshot(session=session, now=clock(), history=timedelta(0))
    assert [(a.alertname, a.target) for a in snap.external_alerts] == [
        ("TTFTHigh", "replica:gpu-a/r0"), ("KVCacheFull", "model:qwen-7b"), ("EngineDown", "replica:gpu-a/r1"),
        ("DiskFull", "unmapped")]
    ttft = snap.external_alerts[0]
    assert ttft.severity == "critical" and ttft.summary == "TTFTHigh is firing"
    assert ttft.starts_at == datetime(2026, 11, 29, 11, 58, 30, 123456, tzinfo=UTC)


def test_the_notifier_leaves_alertmanagers_alerts_to_alertmanager(am_client: TestClient, clock: FakeClock) -> None:
    am_client.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(AM))
    config = NotifierConfig.model_validate({
        "receivers": [{"name": "hook", "alertmanager_webhook": {"url": "http://127.0.0.1:9/hook"}}],
        "route": {"receiver": "hook", "group_wait": "0s"}})
    resolved = resolve_secrets(config, env={}, read_file=lambda _p: "")
    links = notifier.Links(external_url="https://pitstop.example")
    with session_scope(am_client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        own = AlertRow(fingerprint="p1", labels={"alertname": "pitstop-stall", "target": "replica:gpu-a/r0"},
                       annotations={"summary": "stalled"}, severity="page", state="firing", starts_at=T0,
                       ends_at=None, action_id=None, updated_at=T0, policy="stall", last_seen_at=T0,
                       resolved_reason="")
        session.add(own)
        session.flush()
        assert notifier.queue(session=session, notifier=resolved, links=links, now=clock())
        told = [i for d in session.scalars(select(NotificationDelivery)) for i in d.alert_ids or []]
        assert told == [own.id]


def test_a_policy_round_leaves_alertmanagers_alerts_firing(am_client: TestClient, clock: FakeClock) -> None:
    am_client.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(AM))
    with session_scope(am_client.app.state.pitstop.sessions) as session:  # type: ignore[attr-defined]
        snap = build_snapshot(session=session, now=clock(), history=timedelta(0))
        alerting.sync(session=session, proposals=[], snapshot=snap, policies={}, now=clock())
    assert [a["state"] for a in stored(am_client)] == ["firing"]


def test_database_tokens_of_the_role(db_url: str, clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "--database-url", db_url, "--role", "alertmanager", "--name", "am-prod"]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["token", "create", "--database-url", db_url, "--role", "alertmanager", "--node", "gpu-a"]) != 0
    assert "--node is only for --role agent" in capsys.readouterr().err
    assert main(["token", "list", "--database-url", db_url]) == 0
    assert "am-prod              alertmanager" in capsys.readouterr().out
    with TestClient(create_app(ServerConfig(database_url=db_url), clock=clock, run_jobs=False)) as c:
        assert c.post("/v1/alertmanager", json=payload(TTFT_ON_R0), headers=bearer(token)).status_code == 200
        assert c.get("/v1/nodes", headers=bearer(token)).status_code == 403


def test_tokens_from_the_environment(tmp_path: Path) -> None:
    config = load_config(None, env={"PITSTOP_SERVER_ALERTMANAGER_TOKENS": "am-one, am-two"})
    assert [t.get_secret_value() for t in config.alertmanager_tokens] == ["am-one", "am-two"]
    path = tmp_path / "server.yaml"
    path.write_text("alertmanager_tokens: [am-file]\n")
    assert [t.get_secret_value() for t in load_config(path, env={}).alertmanager_tokens] == ["am-file"]


# The real Alertmanager ---------------------------------------------------------------------------------------

@pytest.fixture
def live_control_plane(tmp_path: Path) -> Iterator[str]:
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", alertmanager_tokens=[AM],
                          agent_tokens=[AGENT], viewer_tokens=[VIEWER])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/healthz"), timeout=15, what="control plane to listen")
        fresh = {**fleet_report(), "sent_at": datetime.now(UTC).isoformat()}
        assert probe.post(f"{url}/v1/agents/gpu-a/report", json=fresh, headers=bearer(AGENT)).status_code == 200
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def real_alertmanager(tmp_path: Path, live_control_plane: str) -> Iterator[str]:
    if shutil.which(ALERTMANAGER_BINARY) is None:
        pytest.skip(f"{ALERTMANAGER_BINARY} is not installed")
    config = {
        "route": {"receiver": "pitstop", "group_by": ["alertname"], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "pitstop", "webhook_configs": [{
            "url": f"{live_control_plane}/v1/alertmanager", "send_resolved": True,
            "http_config": {"authorization": {"type": "Bearer", "credentials": AM}}}]}],
    }
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("w")
    proc = subprocess.Popen([ALERTMANAGER_BINARY, f"--config.file={path}", f"--storage.path={tmp_path / 'am'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), timeout=30, what="Alertmanager to be ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.mark.slow
def test_the_real_alertmanager_delivers_to_the_control_plane(real_alertmanager: str, live_control_plane: str,
                                                              tmp_path: Path) -> None:
    started = datetime.now(UTC) - timedelta(minutes=2)
    alert = {"labels": {"alertname": "TTFTHigh", "node": "gpu-a", "replica": "r0", "severity": "critical"},
             "annotations": {"summary": "TTFT p99 above 1 s"}, "startsAt": started.isoformat(),
             "generatorURL": "http://prometheus.example:9090/graph?g0.expr=ttft"}
    assert probe.post(f"{real_alertmanager}/api/v2/alerts", json=[alert]).status_code == 200

    def listed() -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = probe.get(f"{live_control_plane}/v1/alerts", headers=bearer(VIEWER)).json()
        return answer

    log = tmp_path / "alertmanager.log"
    wait_until(lambda: len(listed()) == 1, timeout=30, what=f"the alert to arrive ({log})")
    [got] = listed()
    assert got["state"] == "firing" and got["labels"]["target"] == "replica:gpu-a/r0"
    assert got["policy"] == ALERTMANAGER_POLICY and len(got["fingerprint"]) == 16
    assert abs(datetime.fromisoformat(got["starts_at"]) - started) < timedelta(milliseconds=1)
    assert got["annotations"]["generator_url"] == alert["generatorURL"]
    # Ended in Alertmanager: the resolve arrives and closes the same row.
    ended = {**alert, "endsAt": (datetime.now(UTC) - timedelta(seconds=1)).isoformat()}
    assert probe.post(f"{real_alertmanager}/api/v2/alerts", json=[ended]).status_code == 200
    wait_until(lambda: [a["state"] for a in listed()] == ["resolved"], timeout=30, what=f"the resolve ({log})")
    metrics = probe.get(f"{live_control_plane}/metrics").text
    assert 'pitstop_cp_alertmanager_alerts_total{target="replica"}' in metrics
