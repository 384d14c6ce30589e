"""Scrape one engine's /metrics with an injected ``httpx.AsyncClient`` and turn it into an ``EngineSample``.

A failed scrape (timeout, refused, garbage) becomes ``scrape_error`` in the sample and a counted error; it
never raises into the supervisor. A slow scrape is not a dead engine (docs/design.md: one scrape took 2.8 s on a
starved API server), so the timeout is generous and liveness is judged by the supervisor, not here.

Bounded on purpose: a body past 16 MiB is refused while it is read (``agent.plain_http``), and a body that
repeats a series or holds more wanted samples than any engine sends is refused by the parser
(``agent.engine_metrics``): an engine that streams without end costs the agent one capped read per scrape,
never its memory, and a wrong body is an error on that replica, never a wrong number.

A read still open a whole interval later (``overdue``) is reported as unread, not as the last figures: those
figures, sent again in every report, would read as a counter standing still (docs/design.md, "Progress").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import urlencode

import httpx

from agent.engine_metrics import (
    EngineSnapshot,
    MetricsParseError,
    counter_delta,
    engine_sample,
    parse_metrics,
    wanted_names,
)
from agent.lean_client import lean_transport
from agent.plain_http import BodyTooLarge, body_too_large, prepare, read_capped
from agent.wire import EngineSample
from engines import DEFAULT_ADAPTER, EngineAdapter

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


def scrape_error(exc: Exception) -> str:
    """What a failed scrape says in ``EngineSample.scrape_error``: the agent's own refusals as they are, an
    HTTP error with its type (``ReadTimeout``, ``ConnectError`` ... say what happened)."""
    too_large = body_too_large(exc)
    if too_large is not None:
        message = f"engine /metrics {too_large}"
    elif isinstance(exc, MetricsParseError) or not str(exc):
        message = str(exc) or type(exc).__name__
    else:
        message = f"{type(exc).__name__}: {exc}"
    return message[:2000]


class EngineScraper:
    """Keeps the previous snapshot of one engine so each scrape yields rates over the last window."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str | None,
                 clock: Callable[[], float], timeout: float = 10.0,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 engine: EngineAdapter = DEFAULT_ADAPTER) -> None:
        self.client = client
        self.engine = engine
        # vLLM and SGLang serve /metrics with prometheus_client, which honours ``name[]``: it sends only the
        # series asked for (~80 lines instead of ~600, less work for a busy API server too). An engine that
        # ignores the parameter sends everything, which the parser reads just the same.
        self.url = base_url.rstrip("/") + engine.probes.metrics + "?" + urlencode(
            [("name[]", n) for n in sorted(wanted_names(engine))])
        self.model = model or None
        self.clock = clock
        self.wall = wall  # names each window's histograms: the control plane counts a window once
        self.timeout = timeout
        self.errors_total = 0
        self._request: httpx.Request | None = None
        self._last_body = b""
        self.previous: EngineSnapshot | None = None
        self.last: EngineSample | None = None
        # The agent's own aborted canaries (``own_aborts``) already seen, and of those, how many the engine's
        # error counter has not shown yet (``_own_errors`` carries them one window).
        self._own_seen = 0
        self._own_unmatched = 0.0
        self.asked_at: float | None = None  # when the read in flight began (None: none is)

    async def scrape(self, own_aborts: int = 0) -> EngineSample:
        """One reading of the engine. ``own_aborts``: how many canaries the agent has cut at their deadline so
        far (a running count): the engine counts each as an aborted request, which is no user's error."""
        self.asked_at = self.clock()
        try:
            # The same request every time: built once (httpx's URL and header merging is a third of a GET).
            if self._request is None:
                self._request = self.client.build_request("GET", self.url, headers=PLAIN, timeout=self.timeout)
            body, encoding = await self._get(self._request)
            if self.previous is not None and body == self._last_body:
                # An idle engine's series did not move: the same figures, read now (what parsing gives).
                snap = EngineSnapshot(self.clock(), self.previous.values, self.previous.histograms)
            else:
                snap = parse_metrics(body.decode(encoding, "replace"), self.clock(), self.model, self.engine)
                self._last_body = body
        except (httpx.HTTPError, MetricsParseError, BodyTooLarge) as exc:
            self.errors_total += 1
            self.last = EngineSample(scrape_error=scrape_error(exc))
            return self.last
        finally:
            self.asked_at = None
        own = self._own_errors(snap, own_aborts)
        sample = engine_sample(snap, self.previous, is_stalled(snap, self.previous), own_errors=own,
                               ended_at=self.wall())
        self.previous = snap
        self.last = sample
        return sample

    def overdue(self) -> EngineSample | None:
        """What to report while a read is still open from an earlier interval: no figures, and for how long it
        has gone unanswered; None when no read is open."""
        if self.asked_at is None:
            return None
        waited = self.clock() - self.asked_at
        return EngineSample(scrape_error=f"engine /metrics unanswered for {waited:.1f}s (the read is still open)")

    async def _get(self, request: httpx.Request) -> tuple[bytes, str]:
        """The body of a 2xx answer to ``request`` and its text encoding; ``httpx.HTTPStatusError`` otherwise.
        On the agent's lean transport the request goes to it directly, built into bytes once."""
        lean = lean_transport(self.client, self.url)
        if lean is not None:
            reply = await lean.fetch(prepare(request))  # its bytes built once per request (``prepare``)
            if reply.status < 300:
                return reply.body, "utf-8"  # the exposition format is UTF-8
            # Rare, and said as httpx says it: the answer as a response, its error raised.
            httpx.Response(reply.status, headers=reply.headers, content=reply.body, request=request).raise_for_status()
        response = await self.client.send(request, stream=True)
        try:
            response.raise_for_status()
            return await read_capped(response), response.encoding or "utf-8"
        finally:
            await response.aclose()

    def _own_errors(self, snap: EngineSnapshot, own_aborts: int) -> float:
        """How many of the errors the engine counted since the previous scrape were the agent's own canaries.

        An abort reaches the engine's counter when the engine notices the closed connection: in the window the
        agent cut the canary or in the next. So what the counter has not shown by then is carried one window
        and no further: a canary the engine never took (a frozen API server) must not hide a user's error later.
        """
        new = max(0, own_aborts - self._own_seen)
        self._own_seen = own_aborts
        delta = counter_delta("errors", snap, self.previous) or 0.0
        owed = self._own_unmatched + new
        matched = min(delta, owed)
        self._own_unmatched = min(float(new), owed - matched)
        return matched

    def forget(self) -> None:
        """Drop the previous snapshot (the engine was restarted on purpose)."""
        self.previous = None
        self._last_body = b""
        self.last = None
        self._own_unmatched = 0.0
