"""A receiver on loopback for notifier tests: records every request (path, headers, body) and answers a
scripted sequence of status codes, then its default."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiving:
    """A receiver on loopback that answers a scripted sequence of codes, then 202."""

    def __init__(self, codes: list[int] | None = None, headers: dict[str, str] | None = None,
                 default: int = 202, port: int = 0) -> None:
        self.codes, self.headers, self.default = list(codes or []), headers or {}, default
        self.bodies: list[Any] = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.raw.append(({k: v for k, v in self.headers.items()}, body))
                outer.bodies.append(json.loads(body))
                code = outer.codes.pop(0) if outer.codes else outer.default
                self.send_response(code)
                for k, v in outer.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(b"nope" if code >= 400 else b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()




def said(kind: str, body: dict[str, Any]) -> str:
    """What one body a receiver of ``kind`` got says: "firing" or "resolved" (``pager``: PagerDuty Events v2,
    ``chat``: Slack; anything else: Alertmanager's webhook or Pitstop's signed one, which carry ``status``)."""
    if kind == "pager":
        return "firing" if body["event_action"] == "trigger" else "resolved"
    if kind == "chat":
        return "firing" if "FIRING" in body["blocks"][0]["text"]["text"] else "resolved"
    return str(body["status"])
