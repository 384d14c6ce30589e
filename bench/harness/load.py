"""Streaming load in a background thread while a benchmark acts, using the simulator's load generator."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from enginesim.loadgen import LoadSpec, RequestResult, run_load


class BackgroundLoad:
    """``run_load(spec)`` on its own event loop in a thread until ``stop()``, which returns the summary.

    Streams still open at ``stop()`` are cut off: the summary counts them as ``requests_cut_off``, neither
    served nor failed.
    """

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.results: list[RequestResult] = []  # the load generator's, each request as it starts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._started.set()
            self.summary = await run_load(self.spec, stop=self._stop, results=self.results)

        try:
            asyncio.run(main())
        except BaseException as exc:  # handed to the caller of stop()
            self.error = exc
            self._started.set()

    def start(self) -> BackgroundLoad:
        self._thread.start()
        self._started.wait(30)
        return self

    def ended(self) -> int:
        """How many requests have ended so far, served or failed."""
        return sum(1 for r in list(self.results) if r.finished)

    def stop(self) -> dict[str, Any]:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)
        if self.error is not None:
            raise self.error
        if self.summary is None:
            raise RuntimeError("the load generator did not finish")
        return self.summary

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self.stop()
