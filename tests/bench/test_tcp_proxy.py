"""The partition the dark-node benchmark makes: connections accepted, no byte passed on, until healed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.harness.tcp_proxy import BlackHoleProxy


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_cut_link_accepts_and_stays_silent_and_a_healed_one_passes_again(upstream: int) -> None:
    with BlackHoleProxy(upstream) as proxy, httpx.Client(timeout=1.0) as client:
        assert client.get(proxy.url).text == "hello"
        proxy.cut()
        # Not refused, not reset: the request goes out and nothing ever comes back, on a kept connection and a new
        # one alike.
        with pytest.raises(httpx.ReadTimeout):
            client.get(proxy.url)
        with httpx.Client(timeout=1.0) as fresh, pytest.raises(httpx.ReadTimeout):
            fresh.get(proxy.url)
        proxy.heal()
        assert client.get(proxy.url).text == "hello"
