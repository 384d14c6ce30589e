"""``pitstop dashboards push``'s Grafana HTTP API client: credentials, sub-paths, paging and refusals that say what
was being pushed (the end-to-end command against a fake Grafana is in tests/observability/test_dashboards.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pitstop.dashboards import GrafanaClient, GrafanaError, main, push, redact

Handler = Callable[[httpx.Request], httpx.Response]
BOARD = {"uid": "pitstop-fleet", "title": "Pitstop fleet", "panels": []}


def client(url: str, handler: Handler, token: str | None = None) -> tuple[GrafanaClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return GrafanaClient(url, token, transport=httpx.MockTransport(record)), seen


def grafana(folders: list[dict[str, Any]] | None = None) -> Handler:
    """Folders and dashboards/db as Grafana answers them (folders paged by limit and page)."""
    held = list(folders or [])

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/grafana")
        if (request.method, path) == ("GET", "/api/folders"):
            limit, page = int(request.url.params["limit"]), int(request.url.params["page"])
            return httpx.Response(200, json=held[(page - 1) * limit:page * limit])
        if (request.method, path) == ("POST", "/api/folders"):
            held.append(json.loads(request.content))
            return httpx.Response(200, json=held[-1])
        if (request.method, path) == ("POST", "/api/dashboards/db"):
            uid = json.loads(request.content)["dashboard"]["uid"]
            return httpx.Response(200, json={"uid": uid, "url": f"/grafana/d/{uid}/x", "version": 3})
        return httpx.Response(404, json={"message": "Not found"})

    return handle


def test_basic_auth_from_the_url_and_a_sub_path_are_kept() -> None:
    api, seen = client("https://admin:s%3Acret@grafana.example/grafana/", grafana())
    with api:
        [pushed] = push(api, [BOARD], folder="Pitstop")
    assert (pushed.uid, pushed.version, pushed.url) == ("pitstop-fleet", 3, "/grafana/d/pitstop-fleet/x")
    assert [(r.method, r.url.path) for r in seen] == [("GET", "/grafana/api/folders"), ("POST", "/grafana/api/folders"),
                                                       ("POST", "/grafana/api/dashboards/db")]
    expected = "Basic " + base64.b64encode(b"admin:s:cret").decode()
    assert all(r.headers["authorization"] == expected for r in seen)
    assert all(r.url.userinfo == b"" for r in seen)


def test_a_token_wins_over_credentials_in_the_url() -> None:
    api, seen = client("http://admin:admin@grafana:3000", grafana(), token="glsa_x")
    with api:
        push(api, [BOARD], folder="General")
    assert [r.url.path for r in seen] == ["/api/dashboards/db"]  # General: no folder to find or create
    assert seen[0].headers["authorization"] == "Bearer glsa_x"


def test_folders_are_read_page_by_page() -> None:
    many = [{"uid": f"f{i}", "title": f"Folder {i}"} for i in range(1500)]
    api, seen = client("http://grafana:3000", grafana(many))
    with api:
        assert api.folders()[-1] == {"uid": "f1499", "title": "Folder 1499"}
    assert [r.url.params["page"] for r in seen] == ["1", "2"]


def test_a_folder_created_meanwhile_is_used() -> None:
    def conflict(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/api/folders":
            return httpx.Response(409, json={"message": "a folder with the same name already exists"})
        if request.url.path == "/api/folders":  # the second look finds what the other push created
            found = [{"uid": "theirs", "title": "Pitstop"}] if calls.count("GET") else []
            calls.append("GET")
            return httpx.Response(200, json=found)
        return grafana()(request)

    calls: list[str] = []
    api, seen = client("http://grafana:3000", conflict)
    with api:
        push(api, [BOARD])
    assert json.loads(seen[-1].content)["folderUid"] == "theirs"


@pytest.mark.parametrize(("status", "needle"), [
    (401, "401 Unauthorized: invalid API key (the token"),
    (403, "403 Forbidden: access denied (the credentials may not"),
    (404, "404 Not Found: access denied (no such API here"),
    (500, "500 Internal Server Error: access denied (Grafana failed on its side)"),
])
def test_a_refused_dashboard_is_named_with_the_status_and_grafanas_message(status: int, needle: str) -> None:
    message = "invalid API key" if status == 401 else "access denied"
    api, _ = client("http://grafana:3000", lambda _: httpx.Response(status, json={"message": message}))
    with api, pytest.raises(GrafanaError) as refused:
        push(api, [BOARD], folder="General")
    assert str(refused.value).startswith("pushing dashboard 'Pitstop fleet' (uid pitstop-fleet): ")
    assert needle in str(refused.value) and refused.value.status == status


def test_a_redirect_or_an_answer_that_is_not_json_is_an_error() -> None:
    login = lambda _: httpx.Response(302, headers={"location": "/login"})  # noqa: E731
    api, _ = client("http://grafana:3000", login)
    with api, pytest.raises(GrafanaError, match="redirected to /login"):
        api.folders()
    api, _ = client("http://grafana:3000", lambda _: httpx.Response(200, text="<html>"))
    with api, pytest.raises(GrafanaError, match="not JSON"):
        api.folders()


def test_unreachable_or_malformed_urls_fail_without_printing_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["push", "--grafana-url", "http://admin:hunter2@127.0.0.1:9", "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9" in err and "hunter2" not in err
    assert main(["push", "--grafana-url", "grafana:3000"]) == 2
    assert "not a Grafana URL" in capsys.readouterr().err
    assert redact("https://u:p@g.example/x") == "https://g.example/x"
