"""Scrape one engine's /metrics with an injected ``httpx.AsyncClient`` and turn it into an ``EngineSample``.

A failed scrape (timeout, refused, garbage) becomes ``scrape_error`` in the sample and a counted error; it
never raises into the supervisor. A slow scrape is not a dead engine (docs/design.md: one scrape took 2.8 s on a
starved API server), so the timeout is generous and liveness is judged by the supervisor, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

import httpx

from agent.engine_metrics import WANTED_NAMES, EngineSnapshot, MetricsParseError, engine_sample, parse_metrics
from agent.wire import EngineSample

# On loopback, gzip costs both sides CPU and saves nothing: ask for the text as it is.
PLAIN = {"Accept-Encoding": "identity"}


def is_stalled(cur: EngineSnapshot, prev: EngineSnapshot | None) -> bool | None:
    """Work queued or running while not one generation token moved since ``prev``.

    ``/health`` stays 200 on a wedged EngineCore (vLLM #39863, #17972, #43423); progress is the signal.
    """
    if prev is None:
        return None
    busy = cur.values.get("running", 0.0) + cur.values.get("waiting", 0.0)
    tokens, before = cur.values.get("generation_tokens"), prev.values.get("generation_tokens")
    if tokens is None or before is None:
        return None
    return busy > 0 and tokens == before


class EngineScraper:
    """Keeps the previous snapshot of one engine so each scrape yields rates over the last window."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str | None,
                 clock: Callable[[], float], timeout: float = 10.0) -> None:
        self.client = client
        # vLLM serves /metrics with prometheus_client's ASGI app, which honours ``name[]``: it sends only the
        # series asked for (~80 lines instead of ~600, less work for a busy API server too). An engine that
        # ignores the parameter sends everything, which the parser reads just the same.
        self.url = base_url.rstrip("/") + "/metrics?" + urlencode([("name[]", n) for n in sorted(WANTED_NAMES)])
        self.model = model or None
        self.clock = clock
        self.timeout = timeout
        self.errors_total = 0
        self._request: httpx.Request | None = None
        self._last_body = b""
        self.previous: EngineSnapshot | None = None
        self.last: EngineSample | None = None

    async def scrape(self) -> EngineSample:
        try:
            # The same request every time: built once (httpx's URL and header merging is a third of a GET).
            if self._request is None:
                self._request = self.client.build_request("GET", self.url, headers=PLAIN, timeout=self.timeout)
            response = await self.client.send(self._request)
            response.raise_for_status()
            if self.previous is not None and response.content == self._last_body:
                # An idle engine's series did not move: the same figures, read now (what parsing gives).
                snap = EngineSnapshot(self.clock(), self.previous.values, self.previous.histograms)
            else:
                snap = parse_metrics(response.text, self.clock(), self.model)
                self._last_body = response.content
        except (httpx.HTTPError, MetricsParseError) as exc:
            self.errors_total += 1
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.last = EngineSample(scrape_error=message[:2000])
            return self.last
        sample = engine_sample(snap, self.previous, is_stalled(snap, self.previous))
        self.previous = snap
        self.last = sample
        return sample

    def forget(self) -> None:
        """Drop the previous snapshot (the engine was restarted on purpose)."""
        self.previous = None
        self._last_body = b""
        self.last = None
