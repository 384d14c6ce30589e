"""Small helpers shared by the test suites: free loopback ports and waiting for servers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from bench.harness.http import http_ok, probe
from bench.harness.ports import free_port

__all__ = ["SteadyTraffic", "free_port", "http_ok", "serve_in_thread", "wait_until"]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1, what: str = "condition") -> None:
    """Poll ``predicate`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class SteadyTraffic:
    """A short completion to one engine every ``every`` seconds, each in its own thread, until stopped.

    On a healthy engine the requests finish; on a wedged one they stay queued, which is what a stall looks like
    from outside. A request that fails or times out is dropped: the traffic is there to be observed, not checked.
    """

    def __init__(self, port: int, *, every: float, timeout: float) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.every = every
        self.timeout = timeout
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _one(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            probe.post(self.url, json={"model": "tiny", "prompt": "hello", "max_tokens": 16}, timeout=self.timeout)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            threading.Thread(target=self._one, daemon=True).start()

    def __enter__(self) -> SteadyTraffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


@contextlib.contextmanager
def serve_in_thread(app: Any, ready_path: str = "/healthz", timeout: float = 15) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port in a thread; yields its URL once ``ready_path`` is 200."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}{ready_path}"), timeout=timeout, what="the server to listen")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
