"""``pitstop dashboards push``: upload the Grafana dashboards in ``dashboards/`` through grafana-client.

Each dashboard JSON is posted to ``/api/dashboards/db`` with ``overwrite: true`` into one folder (created when
missing), so pushing again replaces the dashboards by uid instead of duplicating them. The dashboards select
their Prometheus data source through a ``${datasource}`` variable, so the same files work on any Grafana.
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
from typing import Any, Protocol

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "dashboards"
DEFAULT_FOLDER = "Pitstop"
GENERAL_FOLDER = "General"  # Grafana's root: no folder uid


class Folders(Protocol):
    def get_all_folders(self) -> Any: ...
    def create_folder(self, title: str, uid: str | None = None) -> Any: ...


class Dashboards(Protocol):
    def update_dashboard(self, dashboard: dict[str, Any]) -> Any: ...


class Grafana(Protocol):
    """The part of ``grafana_client.GrafanaApi`` this command uses."""

    @property
    def folder(self) -> Folders: ...
    @property
    def dashboard(self) -> Dashboards: ...


class DashboardFileError(ValueError):
    """A dashboard file that is not a Grafana dashboard (names the file)."""


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


def ensure_folder(api: Grafana, title: str) -> str | None:
    """The uid of the folder called ``title``, created when missing; None for Grafana's General folder."""
    if title == GENERAL_FOLDER:
        return None
    for folder in api.folder.get_all_folders() or []:
        if folder.get("title") == title:
            return str(folder["uid"])
    created = api.folder.create_folder(title, uid=folder_uid_for(title))
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
        answer = api.dashboard.update_dashboard(push_request(board, folder_uid, message)) or {}
        pushed.append(Pushed(uid=str(answer.get("uid", board["uid"])), title=str(board["title"]),
                             url=str(answer.get("url", "")), version=answer.get("version")))
    return pushed


def connect(url: str, token: str | None, timeout: float) -> Grafana:
    """A grafana-client API; ``token`` is a service-account or API token (``user:password@`` in the URL works too)."""
    from grafana_client import GrafanaApi

    api: Grafana = GrafanaApi.from_url(url, credential=token or None, timeout=timeout)
    return api


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
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="directory of dashboard JSON files")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if not args.grafana_url:
        print("pitstop dashboards: error: --grafana-url (or GRAFANA_URL) is required", file=sys.stderr)
        return 2
    from grafana_client.client import GrafanaException

    try:
        boards = load_dashboards(args.dir)
        results = push(connect(args.grafana_url, args.token, args.timeout), boards, args.folder)
    except DashboardFileError as exc:
        print(f"pitstop dashboards: error: {exc}", file=sys.stderr)
        return 2
    except GrafanaException as exc:
        print(f"pitstop dashboards: Grafana refused: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # connection refused, DNS, timeouts surface as OSError subclasses in niquests
        print(f"pitstop dashboards: cannot reach {args.grafana_url}: {exc}", file=sys.stderr)
        return 1
    for r in results:
        print(f"{r.uid}\t{r.title}\tversion {r.version}\t{r.url}")
    return 0
