"""Tokens and roles: database tokens from the CLI, scopes, node binding, revocation, rotation, open mode."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.cli import main
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import FakeClock, body, report


def _create(db_url: str, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["token", "create", "--database-url", db_url, *args]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def app_client(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(ServerConfig(database_url=db_url), clock=clock, run_jobs=False)) as c:
        yield c


def test_open_until_the_first_token_then_everything_needs_one(
        db_url: str, clock: FakeClock, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), \
            TestClient(create_app(ServerConfig(database_url=db_url), clock=clock, run_jobs=False)) as c:
        assert "NO API TOKENS EXIST" in caplog.text
        assert c.post("/v1/agents/gpu-a/report", json=body(report())).status_code == 200
        admin = c.post("/v1/tokens", json={"name": "root", "role": "admin"}).json()["token"]
        # The moment a token exists, anonymous reads, reports and writes are refused.
        assert c.get("/v1/nodes").status_code == 401
        assert c.post("/v1/agents/gpu-a/report", json=body(report(sequence=2))).status_code == 401
        assert c.get("/v1/nodes", headers=bearer(admin)).status_code == 200
    assert admin not in caplog.text and admin not in capsys.readouterr().err


def test_roles_nest_and_agents_stay_apart(db_url: str, app_client: TestClient,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    viewer = _create(db_url, capsys, "--role", "viewer", "--name", "dash")
    operator = _create(db_url, capsys, "--role", "operator", "--name", "alice")
    admin = _create(db_url, capsys, "--role", "admin", "--name", "root")
    agent = _create(db_url, capsys, "--role", "agent", "--node", "gpu-a")
    app_client.app.state.pitstop.auth.invalidate()  # the CLI wrote from outside this process
    c = app_client
    assert c.post("/v1/agents/gpu-a/report", json=body(report()), headers=bearer(agent)).status_code == 200
    # A token for node gpu-a cannot report as gpu-b, and non-agent tokens cannot report at all.
    assert c.post("/v1/agents/gpu-b/report", json=body(report("gpu-b")), headers=bearer(agent)).status_code == 403
    assert c.post("/v1/agents/gpu-a/report", json=body(report(sequence=2)),
                  headers=bearer(admin)).status_code == 403
    assert c.get("/v1/replicas", headers=bearer(agent)).status_code == 403
    assert c.get("/v1/replicas", headers=bearer(viewer)).status_code == 200
    act = {"kind": "restart"}
    assert c.post("/v1/replicas/gpu-a/r0/actions", json=act, headers=bearer(viewer)).status_code == 403
    made = c.post("/v1/replicas/gpu-a/r0/actions", json=act, headers=bearer(operator))
    assert made.status_code == 201 and made.json()["requested_by"] == "alice"
    assert c.get("/v1/tokens", headers=bearer(operator)).status_code == 403
    listed = c.get("/v1/tokens", headers=bearer(admin))
    assert listed.status_code == 200 and {t["name"] for t in listed.json()} == {"dash", "alice", "root", "agent"}
    assert "hash" not in listed.text and "salt" not in listed.text and operator not in listed.text


def test_revoke_and_rotate(db_url: str, app_client: TestClient, capsys: pytest.CaptureFixture[str],
                           clock: FakeClock) -> None:
    admin = _create(db_url, capsys, "--role", "admin")
    c = app_client
    c.app.state.pitstop.auth.invalidate()
    made = c.post("/v1/tokens", json={"name": "ops", "role": "operator"}, headers=bearer(admin)).json()
    assert c.get("/v1/nodes", headers=bearer(made["token"])).status_code == 200
    rotated = c.post(f"/v1/tokens/{made['id']}/rotate", json={"overlap_seconds": 60}, headers=bearer(admin)).json()
    # During the overlap both work; after it only the replacement does.
    assert c.get("/v1/nodes", headers=bearer(made["token"])).status_code == 200
    assert c.get("/v1/nodes", headers=bearer(rotated["token"])).status_code == 200
    clock.advance(61)
    c.app.state.pitstop.auth.invalidate()
    assert c.get("/v1/nodes", headers=bearer(made["token"])).status_code == 403
    assert c.post(f"/v1/tokens/{rotated['id']}/revoke", headers=bearer(admin)).status_code == 200
    assert c.get("/v1/nodes", headers=bearer(rotated["token"])).status_code == 403
    # A forged secret for a real id is refused.
    forged = f"pst_{rotated['id']}_" + "x" * 43
    assert c.get("/v1/nodes", headers=bearer(forged)).status_code == 403
    audit = c.get("/v1/audit", headers=bearer(admin)).json()
    assert [a["what"] for a in audit][:3] == ["token.revoke", "token.rotate", "token.create"]
    assert all(a["client"] for a in audit[:3])


def test_cli_list_never_prints_secrets(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    token = _create(db_url, capsys, "--role", "agent", "--node", "gpu-a", "--expires-in", "30d")
    assert main(["token", "list", "--database-url", db_url]) == 0
    listing = capsys.readouterr().out
    secret = token.split("_", 2)[2]
    assert "gpu-a" in listing and "agent" in listing and secret not in listing
    assert main(["token", "create", "--database-url", db_url, "--role", "viewer", "--node", "x"]) == 2
    assert main(["token", "revoke", "--database-url", db_url, "999"]) == 1
