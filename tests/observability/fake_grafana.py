"""A small Grafana HTTP API on loopback (folders and dashboards/db) that records every request it gets."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeGrafanaState:
    token: str
    folders: list[dict[str, Any]] = field(default_factory=list)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)


class FakeGrafana:
    """Answers like Grafana 10/11 for the calls ``pitstop dashboards push`` makes; 401 without the token."""

    def __init__(self, token: str) -> None:
        self.state = state = FakeGrafanaState(token=token)
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with lock:
                    state.requests.append(Recorded(method, self.path, dict(self.headers.items()), body))
                    if self.headers.get("Authorization") != f"Bearer {state.token}":
                        return self._answer(401, {"message": "Unauthorized"})
                    status, payload = _route(state, method, self.path.split("?")[0], body)
                self._answer(status, payload)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeGrafana:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _route(state: FakeGrafanaState, method: str, path: str, body: Any) -> tuple[int, Any]:
    if (method, path) == ("GET", "/api/folders"):
        return 200, [{"id": i + 1, "uid": f["uid"], "title": f["title"]} for i, f in enumerate(state.folders)]
    if (method, path) == ("POST", "/api/folders"):
        if any(f["title"] == body["title"] for f in state.folders):
            return 409, {"message": "a folder with the same name already exists"}
        folder = {"uid": body.get("uid") or f"f{len(state.folders)}", "title": body["title"]}
        state.folders.append(folder)
        return 200, {"id": len(state.folders), **folder}
    if (method, path) == ("POST", "/api/dashboards/db"):
        board = body["dashboard"]
        uid = board["uid"]
        folder = body.get("folderUid")
        if folder is not None and not any(f["uid"] == folder for f in state.folders):
            return 400, {"message": "folder not found"}
        if uid in state.dashboards and not body.get("overwrite"):
            return 412, {"status": "name-exists", "message": "A dashboard with the same uid already exists"}
        state.dashboards[uid] = body
        state.versions[uid] = state.versions.get(uid, 0) + 1
        return 200, {"id": 1, "uid": uid, "url": f"/d/{uid}/{uid}", "status": "success",
                     "version": state.versions[uid]}
    return 404, {"message": "not found"}
