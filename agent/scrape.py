"""Scrape one engine's /metrics with an injected ``httpx.AsyncClient`` and turn it into an ``EngineSample``.

A failed scrape (timeout, refused, garbage) becomes ``scrape_error`` in the sample and a counted error; it
never raises into the supervisor. A slow scrape is not a dead engine (DESIGN.md: one scrape took 2.8 s on a
starved API server), so the timeout is generous and liveness is judged by the supervisor, not here.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from agent.engine_metrics import EngineSnapshot, MetricsParseError, engine_sample, parse_metrics
from agent.wire import EngineSample


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
        self.url = base_url.rstrip("/") + "/metrics"
        self.model = model or None
        self.clock = clock
        self.timeout = timeout
        self.errors_total = 0
        self.previous: EngineSnapshot | None = None
        self.last: EngineSample | None = None

    async def scrape(self) -> EngineSample:
        try:
            response = await self.client.get(self.url, timeout=self.timeout)
            response.raise_for_status()
            snap = parse_metrics(response.text, self.clock(), self.model)
        except (httpx.HTTPError, MetricsParseError) as exc:
            self.errors_total += 1
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.last = EngineSample(scrape_error=message[:2000])
            return self.last
        sample = engine_sample(snap, self.previous)
        sample = sample.model_copy(update={"stalled": is_stalled(snap, self.previous)})
        self.previous = snap
        self.last = sample
        return sample

    def forget(self) -> None:
        """Drop the previous snapshot (the engine was restarted on purpose)."""
        self.previous = None
        self.last = None
