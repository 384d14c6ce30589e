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

``read_capped`` applies the same limit to a streamed response from any transport (httpx's own, for
``https://`` or the agent's default client, would buffer an endless body whole): the scrapes and the canary's
and drain's reads of /metrics use it.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

_MAX_HEADER_BYTES = 64 * 1024
# vLLM's full /metrics is ~70 kB; a multi-LoRA engine's a few hundred kB. Far past any honest body, and small
# enough that eight engines read at once cannot hurt the agent.
MAX_BODY_BYTES = 16 * 1024 * 1024


class BodyTooLarge(ValueError):
    """A response body over the transport's limit."""


class _Closed(Exception):
    """The server closed a reused connection before answering (its keep-alive timeout passed)."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


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


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], limit: int) -> tuple[bytes, bool]:
    """The body and whether the connection can be reused; ``BodyTooLarge`` past ``limit`` bytes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return b"".join(parts), True
            total += size
            if total > limit:
                raise BodyTooLarge(f"body over {limit} bytes")
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > limit:
            raise BodyTooLarge(f"body of {length} bytes is over {limit}")
        return await reader.readexactly(length), True
    # HTTP/1.0 style: the body ends with the connection.
    chunks: list[bytes] = []
    total = 0
    while chunk := await reader.read(256 * 1024):
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(f"body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks), False


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
        try:
            async with asyncio.timeout(limit):
                while True:
                    idle = self._idle.get(key)
                    conn, reused = (idle.pop(), True) if idle else (await self._connect(key, request), False)
                    try:
                        return await self._exchange(conn, key, request, body, reused)
                    except _Closed:
                        continue  # a stale idle connection: try the next one, or a fresh one
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"no answer within {limit:g}s", request=request) from exc
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                OSError) as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc

    async def _connect(self, key: tuple[str, int], request: httpx.Request) -> Connection:
        try:
            conn = await asyncio.open_connection(key[0], key[1], limit=_MAX_HEADER_BYTES)
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
        self.connections_opened += 1
        return conn

    async def _exchange(self, conn: Connection, key: tuple[str, int], request: httpx.Request, body: bytes,
                        reused: bool) -> httpx.Response:
        reader, writer = conn
        try:
            writer.write(_request_bytes(request, body))
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
            content, reusable = (b"", True) if request.method == "HEAD" or status in ("204", "304") \
                else await _read_body(reader, headers, self.max_body_bytes)
        except BaseException:
            _close(writer)
            raise
        if reusable and version == "HTTP/1.1" and headers.get("connection", "").lower() != "close" \
                and len(self._idle.setdefault(key, [])) < self.max_idle_per_host:
            self._idle[key].append(conn)
        else:
            _close(writer)
        return httpx.Response(int(status), headers=pairs, content=content, request=request)

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                _close(writer)
        self._idle.clear()


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


def scrape_client() -> httpx.AsyncClient:
    """The agent's scrape client: this transport for ``http://``, httpx's own for ``https://``."""
    return httpx.AsyncClient(mounts={"http://": PlainHttpTransport()})
