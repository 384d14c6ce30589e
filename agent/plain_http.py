"""A lean httpx transport for plain-HTTP GETs on keep-alive connections: the agent's engine scrapes.

At a 1 s interval with 8 engines the agent makes 8 scrapes a second; through httpx's default transport
(httpcore, h11, anyio) one GET of a 35 kB /metrics cost ~1.4 ms of CPU on a small host, ~0.55 ms through
this one: together with the parser that is most of the agent's budget of 1 % of a core. It stays an httpx
transport, so the scraper still takes an injectable ``httpx.AsyncClient`` (tests give it a mock transport).

Scope, on purpose: ``http://`` only (mount it for that scheme; ``https://`` keeps httpx's own transport),
bodies sent with Content-Length, responses with Content-Length, chunked, or read to EOF, at most
``max_body_bytes`` (an engine streaming without end is an error, never buffered whole), and no
compression (on loopback gzip only costs both sides CPU: ``Accept-Encoding: identity`` is forced). An idle
connection the server closed meanwhile is retried once on a fresh one when nothing was received.

A request whose ``extensions`` ask for ``STREAM`` gets its body as it arrives instead (the canary's server-sent
events: its TTFT is the time to the first chunk), under the same limit and the same deadline, the request's
timeout counted from when it was sent; its connection is kept only once the whole body was read.

``read_capped`` applies the same limit to a streamed response from any transport (httpx's own, for
``https://`` or the agent's default client, would buffer an endless body whole): the scrapes and the canary's
and drain's reads of /metrics use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import httpx

from agent.ticks import until_tick

_MAX_HEADER_BYTES = 64 * 1024
# vLLM's full /metrics is ~70 kB; a multi-LoRA engine's a few hundred kB. Far past any honest body, and small
# enough that eight engines read at once cannot hurt the agent.
MAX_BODY_BYTES = 16 * 1024 * 1024


# ``extensions={STREAM: True}`` on a request: the body is handed on as it arrives (see above).
STREAM = "pitstop.stream"
# How long closing a streamed response waits for the rest of a body it did not read (a canary stops at
# ``[DONE]``; the chunked body's last, empty chunk is usually already there): enough to keep the connection.
_DRAIN_SECONDS = 0.05


class BodyTooLarge(ValueError):
    """A response body over the transport's limit."""


# What reading a connection raises, past a timeout: an ``httpx.ReadError`` (``BodyTooLarge`` is a ValueError).
_READ_ERRORS = (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError)


class _Closed(Exception):
    """The server closed a reused connection before answering (its keep-alive timeout passed)."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


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
    """``request`` (an ``http://`` one with its body in memory) as ``PlainHttpTransport.fetch`` and ``stream`` send
    it; built once per request object, which a caller that sends the same request every interval keeps."""
    prepared = _PREPARED.get(request)
    if prepared is None:
        timeouts = request.extensions.get("timeout", {})
        limit = max((t for t in timeouts.values() if t is not None), default=None)
        prepared = Prepared((request.url.host, request.url.port or 80), request.method,
                            _request_bytes(request, request.read()), limit)
        _PREPARED[request] = prepared
    return prepared


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


async def _chunks(reader: asyncio.StreamReader, headers: dict[str, str], limit: int,
                  done: list[bool]) -> AsyncGenerator[bytes, None]:
    """The body's parts as they arrive, ``BodyTooLarge`` past ``limit`` bytes; ``done`` gets True once the body
    ended where the connection can be reused (a body read to EOF ends with the connection)."""
    total = 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                done.append(True)
                return
            total += size
            if total > limit:
                raise BodyTooLarge(f"body over {limit} bytes")
            part = await reader.readexactly(size)
            await reader.readexactly(2)
            yield part
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > limit:
            raise BodyTooLarge(f"body of {length} bytes is over {limit}")
        if length:
            yield await reader.readexactly(length)
        done.append(True)
        return
    # HTTP/1.0 style: the body ends with the connection.
    while chunk := await reader.read(256 * 1024):
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(f"body over {limit} bytes")
        yield chunk


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], limit: int) -> tuple[bytes, bool]:
    """The body and whether the connection can be reused; ``BodyTooLarge`` past ``limit`` bytes."""
    done: list[bool] = []
    parts = [part async for part in _chunks(reader, headers, limit, done)]
    return (parts[0] if len(parts) == 1 else b"".join(parts)), bool(done)


class _StreamedBody(httpx.AsyncByteStream):
    """A response body read as it arrives, each read before the request's deadline; the connection goes back to
    its pool once the whole body was read, and is closed otherwise."""

    def __init__(self, transport: PlainHttpTransport, key: tuple[str, int], conn: Connection,
                 headers: dict[str, str], keep: bool, deadline: float | None,
                 request: httpx.Request | None) -> None:
        self.transport, self.key, self.conn, self.keep = transport, key, conn, keep
        self.deadline, self.request = deadline, request
        self.done: list[bool] = []
        self.parts = _chunks(conn[0], headers, transport.max_body_bytes, self.done)
        self.closed = False

    # An iterator of its own, not an async generator: a caller that stops at ``[DONE]`` leaves no generator for
    # the loop to finalize (each such one is a wakeup through the loop's self-pipe and a task to close it).
    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            async with asyncio.timeout_at(self.deadline):
                part = await anext(self.parts, None)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("no whole answer before the request's deadline", request=self.request) from exc
        except _READ_ERRORS as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=self.request) from exc
        if part is None:
            raise StopAsyncIteration
        return part

    async def gather(self, seconds: float) -> None:
        """Let the rest of the body collect in the socket for ``seconds`` (to the next tick of them past that),
        then read on: what came meanwhile is read in one go. Each part read as it arrives wakes the agent (a
        canary's answer is a head and one event per token, then ``[DONE]``); a caller that only waits for the end
        of the body need not read them one by one. Nothing is lost: a body not whole by then is read as it
        arrives, before the same deadline."""
        transport = self.conn[1].transport
        if (self.done or not isinstance(transport, asyncio.ReadTransport) or transport.is_closing()
                or not transport.is_reading()):
            return  # ended, going, or paused by its reader's own limit: that pause is the reader's to end
        transport.pause_reading()
        try:
            # From ``seconds`` up to twice that, on their ticks (agent.ticks): the canaries of one round, whose first
            # tokens come within a few milliseconds of each other, read the rest of their answers in one wakeup.
            now = asyncio.get_running_loop().time()
            await asyncio.sleep(seconds + until_tick(now + seconds, seconds))
        finally:
            if not transport.is_closing():
                transport.resume_reading()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.done and self.keep:
            with contextlib.suppress(Exception):  # what is left, if it is already on its way; else closed
                async with asyncio.timeout(_DRAIN_SECONDS):
                    async for _ in self.parts:
                        pass
        await self.parts.aclose()
        if self.done and self.keep:
            self.transport._release(self.key, self.conn)
        else:
            _close(self.conn[1])


class PlainHttpTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over asyncio streams; one idle connection pool per host and port."""

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
        timeouts = request.extensions.get("timeout", {})
        limit = max((t for t in timeouts.values() if t is not None), default=None)
        key = (request.url.host, request.url.port or 80)
        deadline = None if limit is None else asyncio.get_running_loop().time() + limit
        streamed = bool(request.extensions.get(STREAM))
        async with _within(deadline, limit, request):
            conn, status, pairs, headers, keep = await self._sent(key, _request_bytes(request, body), request)
            return await self._answer(conn, key, request, status, pairs, headers, keep,
                                      deadline if streamed else None, streamed)

    async def _connect(self, key: tuple[str, int], request: httpx.Request | None) -> Connection:
        try:
            conn = await asyncio.open_connection(key[0], key[1], limit=_MAX_HEADER_BYTES)
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
        self.connections_opened += 1
        return conn

    async def _head(self, conn: Connection, raw: bytes,
                    reused: bool) -> tuple[int, list[tuple[str, str]], dict[str, str], bool]:
        """Send ``raw`` on ``conn`` and read the response's head: status, header pairs, the headers by lower-cased
        name, and whether the server lets the connection be kept. ``_Closed`` for a reused connection the server
        had closed before answering."""
        reader, writer = conn
        writer.write(raw)
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if reused and not exc.partial:
                raise _Closed from exc
            raise
        lines = head.decode("latin-1").split("\r\n")
        version, status, *_ = lines[0].split(" ", 2)
        pairs = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
        headers = {k.lower(): v for k, v in pairs}
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        return int(status), pairs, headers, keep

    async def _sent(self, key: tuple[str, int], raw: bytes, request: httpx.Request | None = None
                    ) -> tuple[Connection, int, list[tuple[str, str]], dict[str, str], bool]:
        """``raw`` sent on a kept connection to ``key``, or a fresh one, and the head of the answer read: the
        connection, status, header pairs, headers by lower-cased name, and whether it may be kept. A kept one the
        server closed before answering is closed and the next tried; on any other error the connection is closed."""
        while True:
            conn = self._idle_conn(key)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key, request)
            try:
                return (conn, *await self._head(conn, raw, reused))
            except _Closed:
                _close(conn[1])
            except BaseException:
                _close(conn[1])
                raise

    async def _answer(self, conn: Connection, key: tuple[str, int], request: httpx.Request, status: int,
                      pairs: list[tuple[str, str]], headers: dict[str, str], keep: bool,
                      deadline: float | None = None, streamed: bool = False) -> httpx.Response:
        """The response to ``request`` whose head was read on ``conn``: its whole body read, or (``streamed``) the
        body handed on as it arrives, each read before ``deadline`` (a loop time; None: none)."""
        bodiless = request.method == "HEAD" or status in (204, 304)
        if streamed and not bodiless:
            stream = _StreamedBody(self, key, conn, headers, keep, deadline, request)
            return httpx.Response(status, headers=pairs, stream=stream, request=request)
        content = await self._body(conn, key, bodiless, headers, keep)
        return httpx.Response(status, headers=pairs, content=content, request=request)

    async def _body(self, conn: Connection, key: tuple[str, int], bodiless: bool, headers: dict[str, str],
                    keep: bool) -> bytes:
        """The whole body on ``conn``; the connection kept for the next request when it may be, else closed."""
        try:
            body, reusable = (b"", True) if bodiless else await _read_body(conn[0], headers, self.max_body_bytes)
        except BaseException:
            _close(conn[1])
            raise
        if reusable and keep:
            self._release(key, conn)
        else:
            _close(conn[1])
        return body

    async def fetch(self, prepared: Prepared) -> Reply:
        """``prepared`` sent and its whole answer read, without an ``httpx.Response``: the scrapes' path (at a 1 s
        interval the client's layers around this were a third of a scrape). The same connections, limit, retry
        of a stale connection and errors (``httpx.ReadTimeout``, ``ConnectError``, ``ReadError``) as
        ``handle_async_request``."""
        loop_deadline = None if prepared.timeout is None else asyncio.get_running_loop().time() + prepared.timeout
        async with _within(loop_deadline, prepared.timeout):
            conn, status, _, headers, keep = await self._sent(prepared.key, prepared.raw)
            bodiless = prepared.method == "HEAD" or status in (204, 304)
            return Reply(status, headers, await self._body(conn, prepared.key, bodiless, headers, keep))

    async def stream(self, prepared: Prepared) -> tuple[int, _StreamedBody]:
        """``prepared`` sent and the head of its answer read: the status and the body as it arrives (``aclose`` it
        when done), each read before the request's deadline, counted from now. ``fetch``'s errors."""
        deadline = None if prepared.timeout is None else asyncio.get_running_loop().time() + prepared.timeout
        async with _within(deadline, prepared.timeout):
            conn, status, _, headers, keep = await self._sent(prepared.key, prepared.raw)
            return status, _StreamedBody(self, prepared.key, conn, headers, keep, deadline, None)

    def _idle_conn(self, key: tuple[str, int]) -> Connection | None:
        """A kept connection to ``key`` the server has not closed meanwhile (its FIN already read by the loop), or
        None. The server's keep-alive ends where the agent's interval begins: uvicorn, vLLM's server, closes an
        idle connection after 5 s, the default scrape interval, so a try on it would be a write and a read
        for nothing before the fresh connection."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn[0].at_eof() and not conn[1].is_closing():
                return conn
            _close(conn[1])
        return None

    def _release(self, key: tuple[str, int], conn: Connection) -> None:
        """Keep ``conn`` for the next request to ``key``, up to ``max_idle_per_host``; close it otherwise."""
        if len(self._idle.setdefault(key, [])) < self.max_idle_per_host:
            self._idle[key].append(conn)
        else:
            _close(conn[1])

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                _close(writer)
        self._idle.clear()


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


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


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
