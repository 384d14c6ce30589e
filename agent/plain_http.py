"""A lean httpx transport for plain-HTTP requests on keep-alive connections: the agent's engine scrapes,
canaries and reports.

At a 1 s interval with 8 engines the agent makes 8 scrapes a second; through httpx's default transport
(httpcore, h11, anyio) one GET of a 35 kB /metrics cost ~1.4 ms of CPU on a small host, ~0.55 ms through
asyncio's streams, less through this one, whose connections read answers in the loop's callbacks
(``agent.http1``): the task that asked wakes once per answer. It stays an httpx transport, so the scraper
still takes an injectable ``httpx.AsyncClient`` (tests give it a mock transport).

Scope, on purpose: ``http://`` only (mount it for that scheme; ``https://`` keeps httpx's own transport),
bodies sent with Content-Length, responses with Content-Length, chunked, or read to EOF, at most
``max_body_bytes`` (an engine streaming without end is an error, never buffered whole), and no
compression (on loopback gzip only costs both sides CPU: ``Accept-Encoding: identity`` is forced). An idle
connection the server closed meanwhile is retried on a fresh one when nothing was received.

A request whose ``extensions`` ask for ``STREAM`` gets its body as it arrives instead, under the same limit and
the same deadline, the request's timeout counted from when it was sent; its connection is kept only once the
whole body was read. ``read`` hands a ``Prepared`` request's parts to a callback as they arrive, in the loop's
callback itself (the canary's server-sent events: its TTFT is the time to the first token).

``read_capped`` applies the same limit to a streamed response from any transport (httpx's own, for
``https://`` or the agent's default client, would buffer an endless body whole): the scrapes and the canary's
and drain's reads of /metrics use it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from agent.http1 import BodyTooLarge, Closed, Connection, Exchange, Head, OnPart

__all__ = ["MAX_BODY_BYTES", "STREAM", "BodyTooLarge", "PlainHttpTransport", "Prepared", "Reply", "body_too_large",
           "prepare", "read_capped"]

# vLLM's full /metrics is ~70 kB; a multi-LoRA engine's a few hundred kB. Far past any honest body, and small
# enough that eight engines read at once cannot hurt the agent.
MAX_BODY_BYTES = 16 * 1024 * 1024


# ``extensions={STREAM: True}`` on a request: the body is handed on as it arrives (see above).
STREAM = "pitstop.stream"

# What reading an answer raises, past a timeout: an ``httpx.ReadError`` (``BodyTooLarge`` is a ValueError).
_READ_ERRORS = (ConnectionError, ValueError, OSError)


@dataclass(frozen=True)
class Prepared:
    """A request sent the same way every time, its bytes built once: ``prepare``."""

    key: tuple[str, int]
    method: str
    raw: bytes
    timeout: float | None


@dataclass(frozen=True)
class Reply:
    """A whole answer to a ``Prepared`` request: status, headers by lower-cased name, body."""

    status: int
    headers: dict[str, str]
    body: bytes


_PREPARED: weakref.WeakKeyDictionary[httpx.Request, Prepared] = weakref.WeakKeyDictionary()


def prepare(request: httpx.Request) -> Prepared:
    """``request`` (an ``http://`` one with its body in memory) as ``PlainHttpTransport.fetch`` and ``read`` send
    it; built once per request object, which a caller that sends the same request every interval keeps."""
    prepared = _PREPARED.get(request)
    if prepared is None:
        prepared = Prepared((request.url.host, request.url.port or 80), request.method,
                            _request_bytes(request, request.read()), _limit(request))
        _PREPARED[request] = prepared
    return prepared


def _limit(request: httpx.Request) -> float | None:
    timeouts = request.extensions.get("timeout", {})
    return max((t for t in timeouts.values() if t is not None), default=None)


def _request_bytes(request: httpx.Request, body: bytes) -> bytes:
    lines = [f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1"]
    seen = set()
    for key, value in request.headers.multi_items():
        lower = key.lower()
        if lower in ("accept-encoding", "content-length", "transfer-encoding", "connection"):
            continue
        seen.add(lower)
        lines.append(f"{key}: {value}")
    if "host" not in seen:
        lines.append(f"Host: {request.url.netloc.decode('ascii')}")
    lines.append("Accept-Encoding: identity")
    if body or request.method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _PartStream(httpx.AsyncByteStream):
    """A response body handed on as it arrives, each part before the request's deadline; its connection goes back
    to the pool once the whole body was read. Closed early, the rest is waited for a moment (``Exchange.finish``)
    so that the connection can still be kept, and closed otherwise."""

    def __init__(self, deadline: float | None, request: httpx.Request) -> None:
        self.deadline, self.request = deadline, request
        self.parts: collections.deque[bytes] = collections.deque()
        self.exchange: Exchange | None = None
        self._more: asyncio.Future[None] | None = None

    def push(self, part: bytes, _exchange: Exchange) -> None:
        self.parts.append(part)
        self._wake()

    def _wake(self, _done: object = None) -> None:
        if self._more is not None and not self._more.done():
            self._more.set_result(None)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        assert self.exchange is not None
        ended = self.exchange.future
        while not self.parts:
            if ended.done():
                if not ended.cancelled() and ended.exception() is not None:
                    exc = ended.exception()
                    raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=self.request) from exc
                raise StopAsyncIteration
            self._more = asyncio.get_running_loop().create_future()
            ended.add_done_callback(self._wake)
            try:
                async with asyncio.timeout_at(self.deadline):
                    await self._more
            except TimeoutError as exc:
                self.exchange.conn.abort()
                raise httpx.ReadTimeout("no whole answer before the request's deadline", request=self.request) from exc
            finally:
                ended.remove_done_callback(self._wake)
        return self.parts.popleft()

    async def aclose(self) -> None:
        if self.exchange is not None:
            self.exchange.finish()


class PlainHttpTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 on ``agent.http1`` connections; one idle connection pool per host and port."""

    def __init__(self, max_idle_per_host: int = 4, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.max_idle_per_host = max_idle_per_host
        self.max_body_bytes = max_body_bytes
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self.connections_opened = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"PlainHttpTransport speaks http:// only, not {request.url}",
                                            request=request)
        body = await request.aread()
        limit = _limit(request)
        key = (request.url.host, request.url.port or 80)
        deadline = _deadline(limit)
        raw = _request_bytes(request, body)
        bodiless = request.method == "HEAD"
        async with _within(deadline, limit, request):
            if not request.extensions.get(STREAM):
                exchange = await self._answered(key, raw, bodiless, request)
                head = _head(exchange)
                return httpx.Response(head.status, headers=head.pairs, content=exchange.body, request=request)
            stream = _PartStream(deadline, request)
            exchange = await self._answered(key, raw, bodiless, request, on_part=stream.push, until_head=True)
            stream.exchange = exchange
            head = _head(exchange)
            return httpx.Response(head.status, headers=head.pairs, stream=stream, request=request)

    async def fetch(self, prepared: Prepared) -> Reply:
        """``prepared`` sent and its whole answer read, without an ``httpx.Response``: the scrapes' path (at a 1 s
        interval the client's layers around this were a third of a scrape). The same connections, limit, retry
        of a stale connection and errors (``httpx.ReadTimeout``, ``ConnectError``, ``ReadError``) as
        ``handle_async_request``."""
        deadline = _deadline(prepared.timeout)
        async with _within(deadline, prepared.timeout):
            exchange = await self._answered(prepared.key, prepared.raw, prepared.method == "HEAD")
        head = _head(exchange)
        return Reply(head.status, head.headers, exchange.body)

    async def read(self, prepared: Prepared, on_part: OnPart) -> Head:
        """``prepared`` sent and its answer's body handed to ``on_part`` as it arrives, in the loop's callback
        (``on_part`` must not block; it may ``hold`` the reads or ``finish`` the exchange, whose answer's head is
        then returned at once). Returns once the body ended or was finished, before the request's deadline;
        ``fetch``'s errors."""
        deadline = _deadline(prepared.timeout)
        async with _within(deadline, prepared.timeout):
            exchange = await self._answered(prepared.key, prepared.raw, prepared.method == "HEAD", on_part=on_part)
        return _head(exchange)

    async def _answered(self, key: tuple[str, int], raw: bytes, bodiless: bool, request: httpx.Request | None = None,
                        on_part: OnPart | None = None, until_head: bool = False) -> Exchange:
        """``raw`` sent on a kept connection to ``key``, or a fresh one, and its answer read (``until_head``: only
        its head). A kept one the server had closed before answering is dropped and the next tried; given up on
        (a deadline, a cancel), the connection is closed."""
        while True:
            conn = self._idle_conn(key)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key, request)
            exchange = conn.send(raw, limit=self.max_body_bytes, bodiless=bodiless, reused=reused, on_part=on_part,
                                 want_head=until_head)
            try:
                await (exchange.headed if exchange.headed is not None else exchange.future)
                return exchange
            except Closed:
                continue
            except BaseException:
                conn.abort()
                raise

    async def _connect(self, key: tuple[str, int], request: httpx.Request | None) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: Connection(loop, self._release_to(key)), key[0], key[1])
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
        self.connections_opened += 1
        return conn

    def _idle_conn(self, key: tuple[str, int]) -> Connection | None:
        """A kept connection to ``key`` the server has not closed meanwhile (its FIN already read by the loop), or
        None. The server's keep-alive ends where the agent's interval begins: uvicorn, vLLM's server, closes an
        idle connection after 5 s, the default scrape interval, so a try on it would be a write and a read
        for nothing before the fresh connection."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            conn.close()
        return None

    def _release_to(self, key: tuple[str, int]) -> Callable[[Connection], None]:
        def release(conn: Connection) -> None:
            """Keep ``conn`` for the next request to ``key``, up to ``max_idle_per_host``; close it otherwise."""
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle_per_host:
                idle.append(conn)
            else:
                conn.close()
        return release

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def _deadline(timeout: float | None) -> float | None:
    """The loop time ``timeout`` seconds from now; None: no deadline."""
    return None if timeout is None else asyncio.get_running_loop().time() + timeout


def _head(exchange: Exchange) -> Head:
    assert exchange.head is not None  # an exchange answered, or finished by its reader, has its head
    return exchange.head


@contextlib.asynccontextmanager
async def _within(deadline: float | None, limit: float | None,
                  request: httpx.Request | None = None) -> AsyncIterator[None]:
    """The block before ``deadline`` (a loop time), its failures as httpx's errors: a timeout as
    ``ReadTimeout``, a broken or refused read as ``ReadError`` (a ``ConnectError`` passes as it is)."""
    try:
        async with asyncio.timeout_at(deadline):
            yield
    except TimeoutError as exc:
        raise httpx.ReadTimeout(f"no answer within {limit:g}s", request=request) from exc
    except _READ_ERRORS as exc:
        raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc


async def read_capped(response: httpx.Response, limit: int = MAX_BODY_BYTES) -> bytes:
    """A streamed response's body, ``BodyTooLarge`` past ``limit`` bytes, whatever transport read it (this one
    has refused it already; httpx's own, for ``https://``, would buffer an endless body whole)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes is over {limit}")
    parts: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(f"body over {limit} bytes")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def body_too_large(exc: BaseException) -> BodyTooLarge | None:
    """The ``BodyTooLarge`` behind an error: itself, or the cause of the ``httpx.ReadError`` this transport raised."""
    for err in (exc, exc.__cause__):
        if isinstance(err, BodyTooLarge):
            return err
    return None
