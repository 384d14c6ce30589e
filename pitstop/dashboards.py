"""``pitstop dashboards push``: upload the Grafana dashboards in ``dashboards/`` through Grafana's HTTP API.

The dashboards are the ones Pitstop ships (``pitstop.share``), found from any directory; ``--dir`` pushes others.

Each dashboard JSON is posted to ``/api/dashboards/db`` with ``overwrite: true`` into one folder (created when
missing), so pushing again replaces the dashboards by uid instead of duplicating them. The dashboards select
their Prometheus data source through a ``${datasource}`` variable, so the same files work on any Grafana.

The three calls it makes (list folders, create a folder, post a dashboard) go through httpx, not a Grafana client
library: grafana-client's HTTP stack (niquests, urllib3-future) replaces the ``urllib3`` module of the environment
it is installed in and breaks requests-based tools beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import httpx

from pitstop import __version__, share
from pitstop.share import MissingShareError

DEFAULT_FOLDER = "Pitstop"
GENERAL_FOLDER = "General"  # Grafana's root: no folder uid
# GET /api/folders answers a page at a time (Grafana's own default and maximum page size).
FOLDER_PAGE = 1000


class Grafana(Protocol):
    """The Grafana HTTP API calls ``push`` makes."""

    def folders(self) -> list[dict[str, Any]]: ...
    def create_folder(self, title: str, uid: str) -> dict[str, Any]: ...
    def post_dashboard(self, body: dict[str, Any]) -> dict[str, Any]: ...


class DashboardFileError(ValueError):
    """A dashboard file that is not a Grafana dashboard (names the file)."""


class GrafanaUrlError(ValueError):
    """A --grafana-url that is not http[s]://host[:port][/path]."""


class GrafanaError(Exception):
    """Grafana refused a request or answered something else than its API does (names what was being done)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# What each refusal most likely means, after Grafana's own message.
_HINTS = {
    401: "the token (or user:password in the URL) was not accepted",
    403: "the credentials may not do this (a service account with the Editor role may)",
    404: "no such API here: is the URL Grafana's base URL, with its sub-path if it has one?",
}


@dataclass(frozen=True)
class Pushed:
    uid: str
    title: str
    url: str
    version: int | None


def load_dashboards(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` dashboard in ``directory`` (sorted by name); each must have a uid and a title."""
    boards = []
    for path in sorted(directory.glob("*.json")):
        try:
            board = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DashboardFileError(f"{path.name}:{exc.lineno}: {exc.msg}") from exc
        if not isinstance(board, dict) or not board.get("uid") or not board.get("title"):
            raise DashboardFileError(f"{path.name}: not a Grafana dashboard (needs 'uid' and 'title')")
        boards.append(board)
    if not boards:
        raise DashboardFileError(f"no dashboard (*.json) in {directory}")
    return boards


def folder_uid_for(title: str) -> str:
    """A stable folder uid from its title (Grafana uids: at most 40 of [A-Za-z0-9_-])."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", title.strip().lower()).strip("-")[:40] or "pitstop"


def _find_folder(api: Grafana, title: str) -> str | None:
    for folder in api.folders():
        if folder.get("title") == title:
            return str(folder["uid"])
    return None


def ensure_folder(api: Grafana, title: str) -> str | None:
    """The uid of the folder called ``title``, created when missing; None for Grafana's General folder."""
    if title == GENERAL_FOLDER:
        return None
    found = _find_folder(api, title)
    if found is not None:
        return found
    try:
        created = api.create_folder(title, uid=folder_uid_for(title))
    except GrafanaError as exc:
        # 409: created meanwhile (another push), or a folder of that uid with another title.
        if exc.status != 409 or (found := _find_folder(api, title)) is None:
            raise
        return found
    return str(created["uid"])


def push_request(board: dict[str, Any], folder_uid: str | None, message: str) -> dict[str, Any]:
    """The body of ``POST /api/dashboards/db`` for one dashboard: overwrite by uid, never by numeric id."""
    # A numeric id from another Grafana would make this one refuse or clobber an unrelated dashboard.
    dashboard = {k: v for k, v in board.items() if k != "id"} | {"id": None}
    body: dict[str, Any] = {"dashboard": dashboard, "overwrite": True, "message": message}
    if folder_uid is not None:
        body["folderUid"] = folder_uid
    return body


def push(api: Grafana, boards: Sequence[dict[str, Any]], folder: str = DEFAULT_FOLDER,
         message: str = "pushed by pitstop dashboards push") -> list[Pushed]:
    folder_uid = ensure_folder(api, folder)
    pushed = []
    for board in boards:
        answer = api.post_dashboard(push_request(board, folder_uid, message))
        pushed.append(Pushed(uid=str(answer.get("uid", board["uid"])), title=str(board["title"]),
                             url=str(answer.get("url", "")), version=answer.get("version")))
    return pushed


class GrafanaClient:
    """Grafana's HTTP API over httpx: a Bearer ``token`` (service-account or API token), else basic auth from
    ``user:password@`` in the URL; a sub-path in the URL is kept (Grafana behind a proxy), ``?verify=false``
    skips TLS verification."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise GrafanaUrlError(f"not a Grafana URL (http[s]://host[:port][/path]): {redact(url)}")
        headers = {"Accept": "application/json", "User-Agent": f"pitstop/{__version__}"}
        auth: httpx.BasicAuth | None = None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif parsed.username:
            auth = httpx.BasicAuth(parsed.username, parsed.password)
        verify = parsed.params.get("verify", "true").lower() not in ("false", "0", "no", "off")
        self.base_url = str(parsed.copy_with(username=None, password=None, query=None, fragment=None))
        self._http = httpx.Client(base_url=self.base_url, headers=headers, auth=auth, timeout=timeout, verify=verify,
                                  transport=transport)

    def folders(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        page = 1
        while True:
            answer = self._call("GET", "/api/folders", "listing folders",
                                params={"limit": FOLDER_PAGE, "page": page})
            if not isinstance(answer, list) or not all(isinstance(f, dict) for f in answer):
                raise GrafanaError(f"listing folders: {self.base_url}api/folders did not answer a list of folders")
            found += answer
            if len(answer) < FOLDER_PAGE:
                return found
            page += 1

    def create_folder(self, title: str, uid: str) -> dict[str, Any]:
        answer = self._call("POST", "/api/folders", f"creating folder {title!r}", json={"title": title, "uid": uid})
        if not isinstance(answer, dict) or "uid" not in answer:
            raise GrafanaError(f"creating folder {title!r}: the answer names no folder uid")
        return answer

    def post_dashboard(self, body: dict[str, Any]) -> dict[str, Any]:
        board = body["dashboard"]
        answer = self._call("POST", "/api/dashboards/db",
                            f"pushing dashboard {board.get('title')!r} (uid {board.get('uid')})", json=body)
        return answer if isinstance(answer, dict) else {}

    def _call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        answer = self._http.request(method, path, **kwargs)
        if answer.is_redirect:
            raise GrafanaError(f"{what}: {answer.status_code}, redirected to {answer.headers.get('location')} "
                               "(use that URL)", answer.status_code)
        if answer.status_code >= 400:
            raise GrafanaError(f"{what}: {_refusal(answer)}", answer.status_code)
        try:
            return answer.json()
        except ValueError as exc:
            raise GrafanaError(f"{what}: {answer.status_code} with a body that is not JSON: is "
                               f"{self.base_url} Grafana?", answer.status_code) from exc

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GrafanaClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _refusal(answer: httpx.Response) -> str:
    """``401 Unauthorized: Grafana's message (what it likely means)``."""
    said = ""
    try:
        payload = answer.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and payload.get("message"):
        said = f": {payload['message']}"
    elif answer.text.strip():
        said = f": {answer.text.strip()[:200]}"
    hint = _HINTS.get(answer.status_code) or ("Grafana failed on its side" if answer.status_code >= 500 else "")
    return f"{answer.status_code} {answer.reason_phrase}{said}" + (f" ({hint})" if hint else "")


def redact(url: str) -> str:
    """``url`` without a password, for messages."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "<an invalid URL>"
    return str(parsed.copy_with(password=None, username=None)) if parsed.password or parsed.username else url


def connect(url: str, token: str | None, timeout: float) -> GrafanaClient:
    """A client of the Grafana at ``url``; ``token`` is a service-account or API token (``user:password@`` in the
    URL works too)."""
    return GrafanaClient(url, token or None, timeout)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitstop dashboards", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("push", help="create or replace the dashboards in a Grafana folder")
    p.add_argument("--grafana-url", default=os.environ.get("GRAFANA_URL"),
                   help="Grafana base URL, e.g. http://grafana:3000 (env GRAFANA_URL)")
    p.add_argument("--token", default=os.environ.get("GRAFANA_TOKEN"),
                   help="service-account or API token (env GRAFANA_TOKEN)")
    p.add_argument("--folder", default=DEFAULT_FOLDER, help=f"folder title (default {DEFAULT_FOLDER}; "
                   f"'{GENERAL_FOLDER}' for none)")
    p.add_argument("--dir", type=Path, help="directory of dashboard JSON files (default: the shipped dashboards)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if not args.grafana_url:
        print("pitstop dashboards: error: --grafana-url (or GRAFANA_URL) is required", file=sys.stderr)
        return 2
    try:
        boards = load_dashboards(args.dir or share.folder("dashboards"))
        with connect(args.grafana_url, args.token, args.timeout) as api:
            results = push(api, boards, args.folder)
    except (DashboardFileError, MissingShareError, GrafanaUrlError, httpx.InvalidURL) as exc:
        print(f"pitstop dashboards: error: {exc}", file=sys.stderr)
        return 2
    except GrafanaError as exc:
        print(f"pitstop dashboards: Grafana refused: {exc}", file=sys.stderr)
        return 1
    except (httpx.RequestError, OSError) as exc:  # connection refused, DNS, TLS, timeouts
        print(f"pitstop dashboards: cannot reach {redact(args.grafana_url)}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    for r in results:
        print(f"{r.uid}\t{r.title}\tversion {r.version}\t{r.url}")
    return 0
