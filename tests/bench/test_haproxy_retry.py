"""The HAProxy config Pitstop documents resends a request that an engine took and died with before answering.

Two fake engines behind a real HAProxy (``bench.harness.haproxy``: ``balance leastconn``). Engine ``a``
answers every request but the one marked ``x-test-drop``: that one it reads and then dies with, answering
nothing (its listener and the connection closed, as kill -9 leaves them). Engine ``b`` is UP and busy with one
long stream, so leastconn sends every other request to ``a``, the marked one included; it can then only be
served by ``b`` if HAProxy sends it again. The client is httpx, streaming as the chaos tests' load does, and it
writes a request's body apart from its headers, as httpx and most clients do (here a moment later, so that
HAProxy always has the headers first).

Without ``retry-on ... empty-response`` and ``option http-buffer-request`` HAProxy answers the marked request
with 502 when it is the first on its client connection, and closes the client connection without a response
(and without a log line) when it is a later one (httpx: "Server disconnected without sending a response").
"""

from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.harness.haproxy import HAProxy
from bench.harness.procs import Processes
from tests.helpers import free_port, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                       reason="needs Debian's haproxy"),
]

DROP = "x-test-drop"
HOLD = "x-test-hold"
BODY = b'data: {"choices": [{"text": "hi"}]}\n\ndata: [DONE]\n\n'


class FakeEngine:
    """Answers every request 200 on kept-alive connections. One marked ``HOLD`` it answers only once ``release``
    is set; with one marked ``DROP`` it dies if ``mortal`` (and answers it otherwise)."""

    def __init__(self, name: str, *, mortal: bool = False) -> None:
        self.name = name
        self.mortal = mortal
        self.dropped = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            while True:
                lines = []
                while (line := f.readline()) not in (b"\r\n", b""):
                    lines.append(line.decode("latin-1").strip())
                if not lines:
                    return
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
                if self.mortal and DROP in headers:
                    self.dropped.set()
                    self.listener.shutdown(socket.SHUT_RDWR)  # refuses connections from now on
                    return  # and closes this one with the request unanswered
                if "content-length" in headers:
                    f.read(int(headers["content-length"]))
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    while (size := int(f.readline().split(b";")[0], 16)) > 0:
                        f.read(size + 2)
                    f.readline()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"x-engine: " + self.name.encode() + b"\r\n"
                             b"content-length: " + str(len(BODY)).encode() + b"\r\n\r\n")
                if HOLD in headers:
                    self.holding.set()
                    self.release.wait(30)
                conn.sendall(BODY)


class Ready(http.server.BaseHTTPRequestHandler):
    """The agent's readiness endpoint, for every replica: always 200."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _post(client: httpx.Client, url: str, *, mark: str | None = None) -> httpx.Response:
    payload = json.dumps({"model": "m", "prompt": "hello there", "max_tokens": 8, "stream": True}).encode()

    def body() -> Iterator[bytes]:
        time.sleep(0.1)  # the headers reach HAProxy first
        yield payload

    headers = {"content-type": "application/json", "content-length": str(len(payload))}
    if mark:
        headers[mark] = "1"
    with client.stream("POST", f"{url}/v1/completions", content=body(), headers=headers) as response:
        response.read()
    return response


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[HAProxy, FakeEngine, FakeEngine]]:
    """HAProxy in front of ``a`` and ``b``; ``b`` streaming one long request, so leastconn picks ``a``."""
    agent = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Ready)
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    a, b = FakeEngine("a", mortal=True), FakeEngine("b")
    held: list[httpx.Response] = []
    try:
        with Processes(tmp_path / "logs") as processes:
            lb = HAProxy(tmp_path / "haproxy", processes, agent_port=agent.server_address[1],
                         engines={"a": a.port, "b": b.port})
            wait_until(lambda: lb.servers_up() == 2, 20, what="both servers UP in HAProxy")
            lb.command("set server engines/a state drain")  # the long stream goes to b

            def hold() -> None:
                with httpx.Client(timeout=30) as client:
                    held.append(_post(client, lb.url, mark=HOLD))

            holder = threading.Thread(target=hold, daemon=True)
            holder.start()
            assert b.holding.wait(10), "the long stream never reached b"
            lb.command("set server engines/a state ready")
            wait_until(lambda: lb.servers_up() == 2, 10, interval=0.05, what="a UP again")
            yield lb, a, b
            b.release.set()
            holder.join(10)
            assert [r.status_code for r in held] == [200]
    finally:
        b.release.set()
        agent.shutdown()
        for engine in (a, b):
            with contextlib.suppress(OSError):
                engine.listener.close()


@pytest.mark.parametrize("earlier", [0, 2], ids=["first-on-its-connection", "after-two-kept-alive"])
def test_a_request_an_engine_died_with_unanswered_is_served_by_another(
        fleet: tuple[HAProxy, FakeEngine, FakeEngine], earlier: int) -> None:
    lb, a, _ = fleet
    with httpx.Client(timeout=10) as client:
        for _ in range(earlier):  # on the same client connection, which httpx keeps alive
            answered = _post(client, lb.url)
            assert (answered.status_code, answered.headers.get("x-engine")) == (200, "a")
        response = _post(client, lb.url, mark=DROP)
    assert a.dropped.is_set(), "the request never reached the engine that dies with it"
    assert (response.status_code, response.headers.get("x-engine")) == (200, "b"), response.text[:300]
    assert response.content == BODY
