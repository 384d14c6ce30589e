"""Who may see and do what in the console: sign-in with one's own token, ``GET /v1/whoami``, read-only mode, the
trusted proxy's header, and a control plane that goes away."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.console import reads
from controlplane.console.client import ConsoleSettings
from controlplane.console.signin import Identity, SignInRefused, identity_for, proxied, proxy_user, read_only
from tests.console.fleets import healthy
from tests.console.served import buttons, click, open_console, serve, texts
from tests.helpers import free_port


def test_whoami_names_the_token_and_its_role(tmp_path: Path) -> None:
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", viewer_tokens=["look"],
                          agent_tokens=["agent"], operator_tokens=["op"])
    with TestClient(create_app(config, run_jobs=False)) as c:
        def who(token: str | None) -> tuple[int, object]:
            answer = c.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"} if token else {})
            return answer.status_code, answer.json()
        assert who("look") == (200, {"name": "config:viewer-0", "role": "viewer", "anonymous": False})
        assert who("op") == (200, {"name": "config:operator-0", "role": "operator", "anonymous": False})
        assert who("agent")[1] == {"name": "config:agent-0", "role": "agent", "anonymous": False}
        assert who(None)[0] == 401 and who("guess")[0] == 403
    with TestClient(create_app(ServerConfig(database_url=f"sqlite:///{tmp_path / 'open.db'}"), run_jobs=False)) as c:
        assert c.get("/v1/whoami").json() == {"name": "anonymous", "role": "admin", "anonymous": True}


def test_nothing_is_shown_to_a_visitor_who_has_not_signed_in(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url)
        assert buttons(at) == ["Sign in"] and "tiny-llama" not in texts(at) and not at.dataframe
        at.text_input(key="sign_in_token").input("not-a-token")
        click(at, "Sign in")
        assert [e.value for e in at.error] == ["The control plane did not accept that token."]
        at.text_input(key="sign_in_token").input("agent")
        click(at, "Sign in")
        assert "config:agent-0" not in texts(at)
        assert [e.value for e in at.error] == ["that is an agent token: sign in with a viewer, operator or admin token"]
        assert buttons(at) == ["Sign in"]


def test_signing_out_forgets_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op")
        assert "tiny-llama" in texts(at)
        next(b for b in at.sidebar.button if b.label == "Sign out").click().run()
        assert buttons(at) == ["Sign in"] and "tiny-llama" not in texts(at)
        assert "pitstop_identity" not in at.session_state and "pitstop_console" not in at.session_state


def test_a_read_only_console_shows_the_fleet_and_no_button(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        monkeypatch.setenv("PITSTOP_CONSOLE_SERVICE_TOKEN", "look")
        at = open_console(monkeypatch, url, read_only=True)
        assert "**tiny-llama** · 2 of 2 serving" in texts(at)
        assert buttons(at) == [] and "not signed in: read-only console" in at.sidebar.markdown[0].value


def test_a_control_plane_that_goes_away_leaves_the_last_data_and_a_banner(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "look")
        assert not at.error
    reads.forget()  # past the cache's few seconds
    at.run()
    assert not at.exception
    [banner] = at.error
    assert banner.value.startswith("Control plane unavailable: cannot reach the control plane")
    assert "Showing the last data read, from" in banner.value
    assert "**tiny-llama** · 2 of 2 serving" in texts(at)  # still there


def test_an_unreachable_control_plane_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_console(monkeypatch, f"http://127.0.0.1:{free_port()}", "op")
    message = at.error[0].value
    assert "Control plane unavailable" in message and "pitstop server" in message


def test_the_proxy_header_names_a_person_who_reads_but_acts_only_with_their_own_token() -> None:
    headers = {"Host": "console", "X-Forwarded-User": " alice@example.com "}
    assert proxy_user(headers, "x-forwarded-user") == "alice@example.com"
    assert proxy_user(headers, None) is None and proxy_user({}, "X-Forwarded-User") is None
    assert proxy_user({"X-Forwarded-User": "a\nb"}, "X-Forwarded-User") is None
    service = identity_for("console-reader", "viewer", False, "svc-secret", "console")
    alice = proxied("alice@example.com", service)
    assert alice.token == "svc-secret" and not alice.can_act
    assert alice.describe().startswith("alice@example.com (named by the proxy), reading as console-reader")
    # Even an operator service token gives a proxy-named person no buttons: writes would carry its name.
    assert not proxied("alice", identity_for("console", "operator", False, "svc", "console")).can_act


def test_identities() -> None:
    me = identity_for("ana", "operator", False, "secret-token", "token")
    assert me.can_act and "secret-token" not in repr(me)
    assert not identity_for("vic", "viewer", False, "t", "token").can_act
    with pytest.raises(SignInRefused):
        identity_for("config:alertmanager-0", "alertmanager", False, "t", "token")
    assert read_only(ConsoleSettings()) is None
    visitor = read_only(ConsoleSettings(read_only=True, service_token="look"))
    assert isinstance(visitor, Identity) and visitor.token == "look" and not visitor.can_act


def test_launch_passes_the_sign_in_modes_by_environment() -> None:
    from controlplane.console import launch

    args = launch._parser().parse_args(["--read-only", "--user-header", "X-Forwarded-User"])
    env = launch.environment(args, {})
    assert env["PITSTOP_CONSOLE_READ_ONLY"] == "1" and env["PITSTOP_CONSOLE_USER_HEADER"] == "X-Forwarded-User"
    assert "PITSTOP_CONSOLE_TOKEN" not in env  # no token: each person signs in with their own
    settings = ConsoleSettings.from_env({**env, "PITSTOP_CONSOLE_SERVICE_TOKEN": "svc"})
    assert settings.read_only and settings.user_header == "X-Forwarded-User" and settings.service_token == "svc"
    assert "svc" not in repr(settings)
