"""A loopback HTTP receiver for the benchmarks: every POST handed to ``receive`` with its wall-clock arrival
time, answered with what ``receive`` returns; started and stopped as a context manager."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

# (status code, headers, body) for one received request.
Answer = tuple[int, dict[str, str], bytes]


class LoopbackReceiver:
    def __init__(self, path: str, receive: Callable[[float, bytes], Answer]) -> None:
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.time()
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    code, headers, body = receive(at, raw)
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()
