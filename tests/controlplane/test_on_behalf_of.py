"""Acting on behalf of a person a trusted proxy names: only through a static token configured with
``on_behalf_of``, at the lower of the token's role and the person's, recorded as the person with the token
beside them; every other use of ``X-Pitstop-On-Behalf-Of`` is refused, never ignored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ConfigError, PersonRole, ServerConfig, load_config
from controlplane.policy.guardrails import Decision, Verdict
from controlplane.policy.proposals import ProposedAction, Target
from controlplane.remediation.loop import REQUESTED_BY
from controlplane.remediation.records import record_decision
from controlplane.security.roles import MAX_PERSON_LENGTH, ON_BEHALF_OF_HEADER, PERSON_ROLES, person_name_problem
from controlplane.store.db import session_scope
from tests.controlplane.fixtures import FakeClock, body, replica, report

ADMIN = {"Authorization": "Bearer root"}
PEOPLE = {"default_role": "viewer", "roles": {"alice@example.com": "admin", "olga": "operator"}}


def as_person(token: str, person: str | bytes) -> dict[str | bytes, str | bytes]:
    header = person if isinstance(person, bytes) else person.encode("ascii")
    return {b"Authorization": f"Bearer {token}".encode(), ON_BEHALF_OF_HEADER.encode(): header}


@pytest.fixture
def c(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    # "svc" (operator) and "peek" (viewer) may act for people; "ops" is a plain operator token.
    config = ServerConfig(database_url=db_url, admin_tokens=["root"], agent_tokens=["agent"],
                          alertmanager_tokens=["am"], people=PEOPLE,
                          operator_tokens=["ops", {"token": "svc", "on_behalf_of": True}],
                          viewer_tokens=[{"token": "peek", "on_behalf_of": True}])
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as client:
        r = report(replicas=[replica("r0"), replica("r1")])
        assert client.post("/v1/agents/gpu-a/report", json=body(r), headers={"Authorization": "Bearer agent"}
                           ).status_code == 200
        yield client


def test_whoami_answers_for_the_person_at_the_lower_of_the_two_roles(c: TestClient) -> None:
    def who(token: str, person: str) -> dict[str, object]:
        answer = c.get("/v1/whoami", headers=as_person(token, person))
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    assert c.get("/v1/whoami", headers={"Authorization": "Bearer svc"}).json() == {
        "name": "config:operator-1", "role": "operator", "anonymous": False, "on_behalf_of": True, "via": None}
    assert c.get("/v1/whoami", headers={"Authorization": "Bearer ops"}).json()["on_behalf_of"] is False
    # An admin person through an operator token acts as an operator: never more than the token.
    assert who("svc", "alice@example.com") == {"name": "alice@example.com", "role": "operator", "anonymous": False,
                                               "on_behalf_of": False, "via": "config:operator-1"}
    assert who("svc", "olga")["role"] == "operator"
    # Anyone not listed gets default_role; a viewer token caps everyone at viewer.
    assert who("svc", "mallory")["role"] == "viewer"
    assert who("peek", "alice@example.com")["role"] == "viewer"


def test_a_person_acts_as_themself_and_the_records_name_them_and_the_token(c: TestClient) -> None:
    made = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=as_person("svc", "olga"))
    assert made.status_code == 201, made.text
    assert made.json()["requested_by"] == "olga"
    silence = c.post("/v1/silences", json={"matchers": ["alertname=Hot"], "duration": "1h", "comment": "fan"},
                     headers=as_person("svc", "olga"))
    assert silence.status_code == 201 and silence.json()["created_by"] == "olga"
    audit = c.get("/v1/audit", headers=ADMIN).json()
    assert [(a["what"], a["actor"], a["role"], a["detail"].get("via")) for a in audit] == [
        ("silence.create", "olga", "operator", "config:operator-1"),
        ("action.restart", "olga", "operator", "config:operator-1")]
    # The audit log finds the person's writes by their name; the token acting as itself records no "via".
    assert len(c.get("/v1/audit?actor=olga", headers=ADMIN).json()) == 2
    assert c.post("/v1/nodes/gpu-a/actions", json={"kind": "cordon"}, headers={"Authorization": "Bearer svc"}
                  ).json()["requested_by"] == "config:operator-1"
    assert "via" not in c.get("/v1/audit", headers=ADMIN).json()[0]["detail"]


def test_a_proposal_is_approved_by_the_person(c: TestClient) -> None:
    ctx = c.app.state.pitstop  # type: ignore[attr-defined]
    proposal = ProposedAction(policy="itl-slo", kind="restart", reason="ITL p99 above 0.2s", model="tiny-llama",
                              target=Target(kind="replica", node="gpu-a", replica="r0", model="tiny-llama"),
                              replicas=["gpu-a/r0"])
    with session_scope(ctx.sessions) as session:
        action_id = record_decision(session=session, now=ctx.clock(), requested_by="policy:itl-slo", policy="itl-slo",
                                    decision=Decision(action=proposal, verdict=Verdict.AWAITING_APPROVAL)).id
    approved = c.post(f"/v1/actions/{action_id}/approve", headers=as_person("svc", "alice@example.com"))
    assert approved.status_code == 200 and approved.json()["approved_by"] == "alice@example.com"


def test_the_persons_role_caps_what_they_may_do(c: TestClient) -> None:
    refused = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=as_person("svc", "mallory"))
    assert refused.status_code == 403
    assert refused.json()["detail"] == "an operator is needed: mallory acts as viewer (through config:operator-1)"
    # The token's role caps too: an admin person through an operator token may not force or manage tokens.
    alice = as_person("svc", "alice@example.com")
    assert c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart", "force": True},
                  headers=alice).status_code == 403
    assert c.get("/v1/tokens", headers=alice).status_code == 403
    # A viewer person still reads.
    assert c.get("/v1/replicas", headers=as_person("svc", "mallory")).status_code == 200
    assert c.get("/v1/actions", headers=ADMIN).json() == []


def test_a_token_without_the_permission_is_refused_not_served_as_itself(c: TestClient) -> None:
    for token in ("ops", "root"):
        for method, path in (("GET", "/v1/whoami"), ("GET", "/v1/replicas"), ("POST", "/v1/nodes/gpu-a/actions")):
            answer = c.request(method, path, json={"kind": "cordon"}, headers=as_person(token, "olga"))
            assert answer.status_code == 403, (token, path)
            assert "may not act on behalf of anyone" in answer.json()["detail"]
    # Database tokens never delegate, whatever their role.
    made = c.post("/v1/tokens", json={"name": "console", "role": "operator"}, headers=ADMIN).json()["token"]
    assert c.get("/v1/whoami", headers=as_person(made, "olga")).status_code == 403
    # An agent or an Alertmanager never acts for anyone, even on its own endpoint.
    agent = c.post("/v1/agents/gpu-a/report", json=body(report(sequence=2)), headers=as_person("agent", "olga"))
    assert agent.status_code == 403
    hook = c.post("/v1/alertmanager", json={"version": "4", "alerts": []}, headers=as_person("am", "olga"))
    assert hook.status_code == 403
    assert c.get("/v1/actions", headers=ADMIN).json() == []
    # Without a token the header changes nothing: 401 as ever.
    assert c.get("/v1/whoami", headers={ON_BEHALF_OF_HEADER: "olga"}).status_code == 401


@pytest.mark.parametrize("value", [
    b"", b"x" * (MAX_PERSON_LENGTH + 1), b"a\x01b", b"tab\there", "Jos\u00e9".encode(), b"\xff\xfe",
    b"anonymous", REQUESTED_BY.encode(), b"config:admin-0",
])
def test_a_header_that_names_nobody_is_a_400(c: TestClient, value: bytes) -> None:
    answer = c.get("/v1/whoami", headers=as_person("svc", value))
    assert answer.status_code == 400 and answer.json()["detail"].startswith(ON_BEHALF_OF_HEADER)
    made = c.post("/v1/replicas/gpu-a/r0/actions", json={"kind": "restart"}, headers=as_person("svc", value))
    assert made.status_code == 400
    assert c.get("/v1/actions", headers=ADMIN).json() == []


def test_two_names_are_a_400_and_the_longest_name_fits_the_records(c: TestClient) -> None:
    twice = [("Authorization", "Bearer svc"), (ON_BEHALF_OF_HEADER, "olga"), (ON_BEHALF_OF_HEADER, "alice@example.com")]
    answer = c.get("/v1/whoami", headers=twice)
    assert answer.status_code == 400 and "2 times" in answer.json()["detail"]
    longest = "p" * MAX_PERSON_LENGTH
    assert c.post("/v1/nodes/gpu-a/actions", json={"kind": "cordon"}, headers=as_person("svc", longest)
                  ).status_code == 403  # a viewer, but a name the records hold
    assert c.get("/v1/whoami", headers=as_person("svc", longest)).json()["name"] == longest


def test_an_open_control_plane_refuses_the_header(tmp_path: Path) -> None:
    with TestClient(create_app(ServerConfig(database_url=f"sqlite:///{tmp_path / 'open.db'}"), run_jobs=False)) as c:
        answer = c.get("/v1/whoami", headers={ON_BEHALF_OF_HEADER: "olga"})
        assert answer.status_code == 403 and "open" in answer.json()["detail"]
        assert c.get("/v1/whoami").json()["anonymous"] is True


def test_the_permission_and_the_people_come_from_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'cp.db'}\n"
                    "operator_tokens: [plain, {token_env: CONSOLE_TOKEN, on_behalf_of: true}]\n"
                    "people: {roles: {olga: operator}}\n")
    config = load_config(path, env={})
    assert config.people.default_role == "viewer" and config.people.role_of("olga") == "operator"
    assert "CONSOLE_TOKEN" in repr(config.operator_tokens) and "plain" not in repr(config.operator_tokens)
    # The variable is read when the app starts: unset, the server refuses to start, naming the entry.
    monkeypatch.delenv("CONSOLE_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"operator_tokens\[1\]: token_env CONSOLE_TOKEN"):
        create_app(config, run_jobs=False)
    monkeypatch.setenv("CONSOLE_TOKEN", "from-the-environment")
    with TestClient(create_app(config, run_jobs=False)) as c:
        assert c.get("/v1/whoami", headers=as_person("from-the-environment", "olga")).json()["role"] == "operator"
        assert c.get("/v1/whoami", headers=as_person("plain", "olga")).status_code == 403
    # The environment's comma-separated lists stay bare secrets.
    env = load_config(None, env={"PITSTOP_SERVER_OPERATOR_TOKENS": "a,b"})
    assert [t.get_secret_value() for t in env.operator_tokens] == ["a", "b"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "needle"), [
    ("operator_tokens: [{on_behalf_of: true}]\n", "token (inline) or token_env"),
    ("operator_tokens: [{token: a, token_env: B, on_behalf_of: true}]\n", "one of them"),
    ("operator_tokens: [{token: '', on_behalf_of: true}]\n", "empty token"),
    ("operator_tokens: [{token: a, on_behalf: true}]\n", "on_behalf"),
    ("agent_tokens: [{token: a, on_behalf_of: true}]\n", "agent_tokens"),
    ("people: {default_role: agent}\n", "'viewer', 'operator' or 'admin'"),
    ("people: {roles: {olga: alertmanager}}\n", "'viewer', 'operator' or 'admin'"),
    ("people: {roles: {'config:admin-0': admin}}\n", "records for itself"),
    ("people: {roles: {'': admin}}\n", "empty"),
])
def test_bad_delegation_settings_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert needle in str(info.value) and str(path) in str(info.value)


def test_person_names_and_roles() -> None:
    assert set(get_args(PersonRole)) == {r.value for r in PERSON_ROLES}  # the settings' roles are the people's
    assert person_name_problem("alice@example.com") is None and person_name_problem("Dana Whitfield") is None
    assert person_name_problem(" alice") is not None and person_name_problem("a\nb") is not None
