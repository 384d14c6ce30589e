"""Who may see and do what in the console: sign-in with one's own token, ``GET /v1/whoami``, read-only mode, the
trusted proxy's header (reading, or acting on the person's behalf), and a control plane that goes away."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from streamlit.runtime.context import ContextProxy
from streamlit.testing.v1 import AppTest

from bench.harness.http import probe
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.console import reads
from controlplane.console.client import ENV_SERVICE_TOKEN, ENV_USER_HEADER, ConsoleSettings, auth_headers
from controlplane.console.frame import Console
from controlplane.console.signin import (
    Identity,
    SignInRefused,
    WhoAmI,
    identity_for,
    proxied,
    proxy_user,
    read_only,
)
from controlplane.security.roles import ON_BEHALF_OF_HEADER
from tests.console.fleets import healthy
from tests.console.served import OPERATOR, buttons, choose_replica, click, open_console, serve, texts
from tests.helpers import free_port

ADMIN = {"Authorization": "Bearer boss"}
# The people the control plane lets the console's service token ("svc", an operator's) act for, and their roles.
PEOPLE = {"roles": {"alice@example.com": "operator", "root@example.com": "admin"}}


def test_whoami_names_the_token_and_its_role(tmp_path: Path) -> None:
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", viewer_tokens=["look"],
                          agent_tokens=["agent"], operator_tokens=["op"])
    with TestClient(create_app(config, run_jobs=False)) as c:
        def who(token: str | None) -> tuple[int, object]:
            answer = c.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"} if token else {})
            return answer.status_code, answer.json()
        plain = {"anonymous": False, "on_behalf_of": False, "via": None}
        assert who("look") == (200, {"name": "config:viewer-0", "role": "viewer", **plain})
        assert who("op") == (200, {"name": "config:operator-0", "role": "operator", **plain})
        assert who("agent")[1] == {"name": "config:agent-0", "role": "agent", **plain}
        assert who(None)[0] == 401 and who("guess")[0] == 403
    with TestClient(create_app(ServerConfig(database_url=f"sqlite:///{tmp_path / 'open.db'}"), run_jobs=False)) as c:
        assert c.get("/v1/whoami").json() == {"name": "anonymous", "role": "admin", "anonymous": True,
                                              "on_behalf_of": False, "via": None}


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
    # The control plane's rule for a person's name: a value it would refuse is not sent at all.
    for unusable in ("a\nb", "x" * 129, "config:admin-0", "Jos\u00e9"):
        assert proxy_user({"X-Forwarded-User": unusable}, "X-Forwarded-User") is None
    service = identity_for("console-reader", "viewer", False, "svc-secret", "console")
    alice = proxied("alice@example.com", service)
    assert alice.token == "svc-secret" and not alice.can_act and alice.on_behalf_of is None
    assert alice.describe().startswith("alice@example.com (named by the proxy), reading as console-reader")
    # A service token that may not act on behalf of people gives them no buttons: writes would carry its name.
    assert not proxied("alice", identity_for("console", "operator", False, "svc", "console")).can_act


def test_a_service_token_that_acts_on_behalf_of_people_gives_them_their_own_role() -> None:
    service = identity_for("config:operator-1", "operator", False, "svc", "console", delegates=True)
    alice = proxied("alice", service, WhoAmI("alice", "operator", via="config:operator-1"))
    assert alice.can_act and alice.on_behalf_of == "alice" and alice.token == "svc"
    assert alice.describe() == "alice (operator, named by the proxy; the console acts for you as config:operator-1)"
    # Every read and every write names the person beside the service token.
    with Console(settings=ConsoleSettings(), identity=alice).client() as client:
        assert client.headers["Authorization"] == "Bearer svc" and client.headers[ON_BEHALF_OF_HEADER] == "alice"
    assert auth_headers("svc", "alice") == {"Authorization": "Bearer svc", ON_BEHALF_OF_HEADER: "alice"}
    with Console(settings=ConsoleSettings(), identity=proxied("alice", service)).client() as client:
        assert ON_BEHALF_OF_HEADER not in client.headers
    # The person's own role decides the buttons: a viewer sees none.
    assert not proxied("vic", service, WhoAmI("vic", "viewer", via="config:operator-1")).can_act
    # An answer that is not about this person (a control plane that ignored the header) only reads.
    for answer in (WhoAmI("config:operator-1", "operator"), WhoAmI("bob", "operator", via="config:operator-1")):
        assert proxied("alice", service, answer).on_behalf_of is None and not proxied("alice", service, answer).can_act


def _behind_proxy(monkeypatch: pytest.MonkeyPatch, user: str, service_token: str) -> None:
    """The console behind a proxy that names ``user`` in X-Forwarded-User, with ``service_token`` as its own."""
    monkeypatch.setenv(ENV_USER_HEADER, "X-Forwarded-User")
    monkeypatch.setenv(ENV_SERVICE_TOKEN, service_token)
    headers = {"Host": "console.example.internal", "X-Forwarded-User": user}
    monkeypatch.setattr(ContextProxy, "headers", property(lambda _: headers))


def _who(at: AppTest) -> str:
    """The sidebar's line naming who is looking (below the "Sign in to act" form, when there is one)."""
    return next(m.value for m in at.sidebar.markdown if not m.value.startswith("**Sign in**"))


def test_behind_a_proxy_an_operator_acts_as_themself_through_the_service_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build, people=PEOPLE) as url:
        _behind_proxy(monkeypatch, "alice@example.com", "svc")
        at = open_console(monkeypatch, url, page="views/replicas.py")
        assert _who(at) == ("**alice@example.com (operator, named by the proxy; the console acts for you as "
                                   "config:operator-1)**")
        assert "Sign in to act" not in [e.label for e in at.sidebar.expander]
        click(at, "Restart")
        assert "guardrails: allowed" in texts(at)  # the preview went through as alice, too
        click(at, "Confirm: restart")
        [done] = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert done["kind"] == "restart" and done["requested_by"] == "alice@example.com"
        [entry] = probe.get(f"{url}/v1/audit", headers=ADMIN).json()
        assert (entry["actor"], entry["role"], entry["detail"]["via"]) == (
            "alice@example.com", "operator", "config:operator-1")


def test_behind_a_proxy_a_viewer_sees_no_button_and_may_sign_in(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build, people=PEOPLE) as url:
        # Not among the people: the default role, a viewer's.
        _behind_proxy(monkeypatch, "vic@example.com", "svc")
        at = open_console(monkeypatch, url)
        assert "**tiny-llama** · 2 of 2 serving" in texts(at) and buttons(at) == []
        assert _who(at).startswith("**vic@example.com (viewer, named by the proxy")
        assert "Read only: no action buttons." in [c.value for c in at.sidebar.caption]
        # Their own operator token still works, and then writes carry its name.
        at.text_input(key="sign_in_token").input("op")
        click(at, "Sign in")
        assert _who(at) == "**config:operator-0 (operator)**"
        choose_replica(at.switch_page("views/replicas.py").run())
        assert "Restart" in buttons(at)


def test_behind_a_proxy_a_service_token_that_may_not_act_for_people_only_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build, people=PEOPLE) as url:
        # "op" is an operator token without on_behalf_of: the console reads with it, without the header.
        _behind_proxy(monkeypatch, "alice@example.com", "op")
        at = open_console(monkeypatch, url, page="views/replicas.py")
        assert not at.error and buttons(at) == []
        assert _who(at) == ("**alice@example.com (named by the proxy), reading as config:operator-0 "
                                   "(operator); sign in with your own token to act**")
        assert "Sign in to act" in [e.label for e in at.sidebar.expander]


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
