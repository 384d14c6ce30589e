"""Simulated agents for the failover and reconnect-storm benchmarks: numbered reports, retries, two servers.

Each agent numbers its reports 1, 2, 3, ... and sends report k until a control plane acknowledges it (200, or
409: it already holds k), then waits one interval and sends k + 1. A retry is the same report byte for byte (same
sequence, same ``sent_at``), which the control plane takes as a duplicate of what it holds: so every sequence an
agent had acknowledged must be stored exactly once, and ``nodes.reports_total`` equal to the agent's count of
acknowledged reports means none was lost and none counted twice. (The real agent builds a fresh report for each
attempt; a failed attempt's sequence is then a gap nobody lost, which would hide a lost one.)

After a failure (no answer, or 5xx) an agent tries the next of its control-plane URLs, after a wait:

- ``jitter`` (today's agent): ``agent.retry.report_wait``, full jitter over a doubling backoff capped at four
  intervals, never sooner than Retry-After;
- ``fixed`` (the agent before it): the doubling backoff itself, no jitter, Retry-After ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from agent.retry import report_retry_delay, report_wait, retry_after_seconds

RETRY_MODES = ("jitter", "fixed")


class Connections:
    """Keep-alive HTTP/1.1 connections to one server; each report written as prepared bytes (a general client
    cost the load generator more CPU per report than the server it measures)."""

    def __init__(self, base: str, token: str) -> None:
        url = httpx.URL(base)
        self._host, self._port, self._token = url.host, url.port or 80, token
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: bytes) -> tuple[int, str | None]:
        """The answer's status and Retry-After; an idle keep-alive connection the server closed is retried once."""
        request = (f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nAuthorization: Bearer {self._token}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        while self._idle:
            reader, writer = self._idle.pop()
            try:
                return await self._exchange(reader, writer, request)
            except (OSError, asyncio.IncompleteReadError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return await self._exchange(reader, writer, request)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        request: bytes) -> tuple[int, str | None]:
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)}
            await reader.readexactly(int(headers.get(b"content-length", b"0")))
        except BaseException:
            writer.close()
            raise
        self._idle.append((reader, writer))
        retry_after = headers.get(b"retry-after")
        return status, None if retry_after is None else retry_after.decode()

    def drop(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


@dataclass
class Attempts:
    """What the fleet saw, second by second (loop time floored), for rates and peaks."""

    answered: dict[int, int] = field(default_factory=dict)  # attempts the server answered, any status
    failed: dict[int, int] = field(default_factory=dict)  # attempts with no answer, or 5xx
    acked_at: dict[int, list[float]] = field(default_factory=dict)  # per agent: when each report was acknowledged

    def count(self, table: dict[int, int], at: float) -> None:
        table[int(at)] = table.get(int(at), 0) + 1


@dataclass
class Agent:
    index: int
    template: str
    acked: int = 0  # reports acknowledged; the one being sent is acked + 1
    sent_at: str = ""
    failures: int = 0
    server: int = 0  # which URL it tries now

    @property
    def node(self) -> str:
        return f"node-{self.index:04d}"


class Fleet:
    """``agents`` simulated agents reporting every ``interval`` to ``bases`` (failing over between them)."""

    def __init__(self, bases: list[str], templates: list[str], *, interval: float, token: str, retry: str,
                 concurrency: int = 64, timeout: float = 10.0, seed: int = 1) -> None:
        assert retry in RETRY_MODES
        self.bases = bases
        self.agents = [Agent(i, t) for i, t in enumerate(templates)]
        self.interval, self.retry, self.timeout = interval, retry, timeout
        self._pools = [Connections(b, token) for b in bases]
        self._sem = asyncio.Semaphore(concurrency)
        self._rng = random.Random(seed)
        self.seen = Attempts()
        self.loop = asyncio.get_running_loop()

    def _wait_after_failure(self, agent: Agent, retry_after: str | None) -> float:
        if self.retry == "fixed":
            return report_retry_delay(agent.failures, self.interval)
        return report_wait(agent.failures, self.interval, retry_after_seconds(retry_after, datetime.now(UTC)),
                           self._rng)

    async def _attempt(self, agent: Agent) -> float:
        """Send the agent's current report once; seconds until its next attempt."""
        if not agent.sent_at:
            agent.sent_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = agent.template.replace("{seq}", str(agent.acked + 1)).replace("{at}", agent.sent_at).encode()
        pool = self._pools[agent.server]
        status, retry_after = 0, None
        async with self._sem:
            try:
                status, retry_after = await asyncio.wait_for(pool.post(f"/v1/agents/{agent.node}/report", body),
                                                             self.timeout)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
                pool.drop()
        now = self.loop.time()
        if status:
            self.seen.count(self.seen.answered, now)
        if status in (200, 409):  # stored now, or stored by an earlier attempt whose answer was lost
            agent.acked += 1
            agent.sent_at, agent.failures = "", 0
            self.seen.acked_at.setdefault(agent.index, []).append(now)
            return self.interval
        self.seen.count(self.seen.failed, now)
        agent.failures += 1
        agent.server = (agent.server + 1) % len(self.bases)
        return self._wait_after_failure(agent, retry_after)

    async def _run_agent(self, agent: Agent, start: float, stop: asyncio.Event) -> None:
        await asyncio.sleep(max(0.0, start + self.interval * agent.index / len(self.agents) - self.loop.time()))
        while not stop.is_set():
            wait = await self._attempt(agent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def run(self, stop: asyncio.Event) -> None:
        """Report until ``stop`` is set (each agent finishes the attempt it is in)."""
        start = self.loop.time() + 0.2
        await asyncio.gather(*(self._run_agent(a, start, stop) for a in self.agents))
        for pool in self._pools:
            pool.drop()

    def current_since(self, since: float) -> float | None:
        """When every agent had a report acknowledged after ``since`` (loop time), or None if one has not."""
        latest = 0.0
        for agent in self.agents:
            after = [t for t in self.seen.acked_at.get(agent.index, []) if t > since]
            if not after:
                return None
            latest = max(latest, after[0])
        return latest

    def peak(self, table: dict[int, int], since: float, until: float) -> int:
        return max((n for second, n in table.items() if since <= second <= until), default=0)


class Background:
    """A ``Fleet`` reporting from a thread of its own until ``stop``: the rest of a fleet, around the nodes a
    benchmark measures. Its reports are acknowledged or retried as an agent's would be."""

    def __init__(self, base: str, templates: list[str], *, interval: float, token: str) -> None:
        import threading

        self._args = (base, templates, interval, token)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.fleet: Fleet | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="background-fleet",
                                        daemon=True)

    async def _run(self) -> None:
        base, templates, interval, token = self._args
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.fleet = Fleet([base], templates, interval=interval, token=token, retry="jitter")
        self._ready.set()
        await self.fleet.run(self._stop)

    def start(self) -> Background:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
