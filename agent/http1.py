"""HTTP/1.1 answers read in the event loop's own callbacks: the connections of the agent's lean transport.

Through asyncio's streams, every read of an answer's parts is a step of the task awaiting it: a canary's head,
its four token events and ``[DONE]`` were four to six task steps, each woken by the loop, on every replica
every interval. Here a connection is an ``asyncio.Protocol``: the answer is parsed as its bytes arrive, in
``data_received``, and the task waiting for it wakes once, when the answer is whole, or, for a reader handed
the parts as they come (``on_part``), when that reader says it has what it needs (``Exchange.finish``).

An answer ends with its Content-Length, its last chunk and trailers, or the connection (no length: HTTP/1.0
style). A body past the exchange's limit fails it with ``BodyTooLarge`` as soon as it is announced or read:
an endless body is never buffered whole. A reused connection that the server closed before answering fails
with ``Closed``, for the caller to try a fresh one. A connection is given back (``release``) only once its
answer was read to the end and both sides let it be kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

MAX_HEADER_BYTES = 64 * 1024
# A chunk's size line is a few hex digits and perhaps an extension; anything longer is not HTTP.
_MAX_SIZE_LINE = 1024
# How long an answer its reader finished early (a canary at ``[DONE]``) may take to end, for its connection to be
# kept: the last, empty chunk is usually in the same read. Closed past that.
DRAIN_SECONDS = 0.05

# What an answer's body is read up to, as the parser goes.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _TO_EOF, _DONE = range(8)


class BodyTooLarge(ValueError):
    """A response body over the transport's limit."""


class Closed(ConnectionError):
    """The server closed a reused connection before answering (its keep-alive timeout passed)."""


@dataclass(frozen=True)
class Head:
    """The head of an answer: status, header pairs as sent, the headers by lower-cased name, and whether the
    server lets the connection be kept."""

    status: int
    pairs: list[tuple[str, str]]
    headers: dict[str, str]
    keep: bool


def parse_head(raw: bytes) -> Head:
    """An answer's head, up to (not including) its empty line; ``ValueError`` when it is not HTTP/1.x."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status = rest[:3]
    if not version.startswith("HTTP/1.") or not status.isdigit():
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    pairs = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
    headers = {k.lower(): v for k, v in pairs}
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    return Head(int(status), pairs, headers, keep)


OnPart = Callable[[bytes, "Exchange"], None]


class Exchange:
    """One request's answer, read as it arrives. ``future`` is done when the answer is whole (``body`` holds it,
    unless an ``on_part`` reader took the parts), when it failed (its exception), or when the reader called
    ``finish``."""

    def __init__(self, conn: Connection, *, limit: int, bodiless: bool, reused: bool,
                 on_part: OnPart | None = None, want_head: bool = False) -> None:
        self.conn, self.limit, self.bodiless, self.reused = conn, limit, bodiless, reused
        self.on_part = on_part
        self.future: asyncio.Future[None] = conn.loop.create_future()
        # ``want_head``: a future done once the head is in (or failed with the exchange), for a caller that hands
        # the body on as it comes. Either may then go unawaited: their failures count as seen.
        self.headed: asyncio.Future[None] | None = None
        if want_head:
            self.headed = conn.loop.create_future()
            self.headed.add_done_callback(_seen)
            self.future.add_done_callback(_seen)
        self.head: Head | None = None
        self.parts: list[bytes] = []
        self.received = False  # a byte of the answer came
        self.complete = False  # the whole answer was read
        self.finished = False  # its reader needs no more (``finish``)

    @property
    def body(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)

    def hold(self, until: float) -> None:
        """Read nothing more on this connection until loop time ``until``: what arrives meanwhile collects in the
        socket and is read in one go then. Readers holding to the same time resume in one pass of the loop."""
        self.conn.hold(until)

    def finish(self) -> None:
        """The reader has what it needs: the waiting task wakes now. The rest of the answer is still read, for up to
        ``DRAIN_SECONDS``, so that the connection can be kept; it is closed otherwise."""
        if self.finished:
            return
        self.finished = True
        if not self.future.done():
            self.future.set_result(None)
        if not self.complete:
            self.conn.drain_for(DRAIN_SECONDS)


class Connection(asyncio.Protocol):
    """A client connection that reads one answer at a time (``send``); ``release`` is called with it once an
    answer ended where the connection can serve the next request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, release: Callable[[Connection], None]) -> None:
        self.loop, self.release = loop, release
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False
        self._buf = bytearray()
        self._state = _DONE
        self._left = 0  # bytes of the body, or of the chunk, still to come
        self._total = 0  # body bytes so far
        self._keep = False
        self._timer: asyncio.TimerHandle | None = None  # a hold's end, or a drain's deadline

    # -- what the transport calls

    @property
    def usable(self) -> bool:
        """Idle and open: no answer pending, and the server has not closed its side."""
        return self.exchange is None and not self.closed and self.transport is not None \
            and not self.transport.is_closing()

    def send(self, raw: bytes, *, limit: int, bodiless: bool, reused: bool, on_part: OnPart | None = None,
             want_head: bool = False) -> Exchange:
        assert self.transport is not None and self.exchange is None
        exchange = Exchange(self, limit=limit, bodiless=bodiless, reused=reused, on_part=on_part,
                            want_head=want_head)
        self.exchange, self._state, self._total = exchange, _HEAD, 0
        self.transport.write(raw)
        return exchange

    def close(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Given up on (a deadline passed, the caller cancelled): the answer is not waited for, the connection
        not kept."""
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            for future in (exchange.headed, exchange.future):
                if future is not None and not future.done():
                    future.cancel()
        self.close()

    def hold(self, until: float) -> None:
        if self.transport is None or self.closed or self._timer is not None:
            return
        self.transport.pause_reading()
        self._timer = self.loop.call_at(until, self._resume)

    def drain_for(self, seconds: float) -> None:
        if self.closed:
            return
        self._cancel_timer()
        self._resume_reading()
        self._timer = self.loop.call_later(seconds, self.close)

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always an ``asyncio.Transport`` by class (uvloop's are not).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # bytes nobody asked for: whatever this server says next cannot be trusted
            self.close()
            return
        exchange.received = True
        if self._buf:
            self._buf += data
        else:
            self._buf = bytearray(data)
        try:
            self._advance(exchange)
        except Exception as exc:  # any failure to read it (a reader's too) ends this answer, and the connection
            self._fail(exchange, exc)

    def eof_received(self) -> bool | None:
        self._ended()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)
        self.closed = True
        self._cancel_timer()

    # -- reading an answer

    def _ended(self, exc: Exception | None = None) -> None:
        exchange = self.exchange
        if exchange is None:
            return
        if self._state == _TO_EOF:
            self._state = _DONE
            self._keep = False
            self._completed(exchange)
        elif exchange.reused and not exchange.received:
            self._fail(exchange, Closed("the server closed the kept connection before answering"))
        else:
            self._fail(exchange, ConnectionError(f"connection closed before the answer was whole{_why(exc)}"))

    def _advance(self, exchange: Exchange) -> None:
        buf = self._buf
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEADER_BYTES:
                        raise ValueError(f"answer head over {MAX_HEADER_BYTES} bytes")
                    return
                head = parse_head(bytes(buf[:end]))
                del buf[:end + 4]
                exchange.head, self._keep = head, head.keep
                self._state = self._body_kind(exchange, head)
                if exchange.headed is not None:
                    exchange.headed.set_result(None)
            elif state in (_LENGTH, _CHUNK_DATA):
                if not buf:
                    return
                take = min(self._left, len(buf))
                part = bytes(buf) if take == len(buf) else bytes(buf[:take])
                del buf[:take]
                self._left -= take
                if not self._left:
                    self._state = _DONE if state == _LENGTH else _CHUNK_END
                self._part(exchange, part)
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > _MAX_SIZE_LINE:
                        raise ValueError("chunk size line too long")
                    return
                digits = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[:end + 2]
                if not digits or digits.lstrip(b"0123456789abcdefABCDEF"):
                    raise ValueError(f"bad chunk size {digits[:20]!r}")
                size = int(digits, 16)
                if size == 0:
                    self._state = _TRAILERS
                else:
                    self._count(exchange, size)
                    self._left, self._state = size, _CHUNK_DATA
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ValueError("chunk not followed by CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_HEADER_BYTES:
                        raise ValueError(f"trailers over {MAX_HEADER_BYTES} bytes")
                    return
                del buf[:end + 2]
                if end == 0:
                    self._state = _DONE
            elif state == _TO_EOF:
                if buf:
                    part = bytes(buf)
                    buf.clear()
                    self._count(exchange, len(part))
                    self._part(exchange, part)
                return
            else:  # _DONE
                if buf:  # more than the answer: the next one cannot be told from it
                    self._keep = False
                    buf.clear()
                self._completed(exchange)
                return

    def _body_kind(self, exchange: Exchange, head: Head) -> int:
        if exchange.bodiless or head.status in (204, 304) or 100 <= head.status < 200:
            return _DONE
        if "chunked" in head.headers.get("transfer-encoding", "").lower():
            return _CHUNK_SIZE
        declared = head.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise ValueError(f"bad Content-Length {declared[:20]!r}")
            length = int(declared)
            if length > exchange.limit:
                raise BodyTooLarge(f"body of {length} bytes is over {exchange.limit}")
            self._left = length
            return _LENGTH if length else _DONE
        self._keep = False
        return _TO_EOF

    def _count(self, exchange: Exchange, size: int) -> None:
        self._total += size
        if self._total > exchange.limit:
            raise BodyTooLarge(f"body over {exchange.limit} bytes")

    def _part(self, exchange: Exchange, part: bytes) -> None:
        if exchange.finished:
            return
        if exchange.on_part is None:
            exchange.parts.append(part)
        else:
            exchange.on_part(part, exchange)

    def _completed(self, exchange: Exchange) -> None:
        exchange.complete = True
        self.exchange = None
        self._cancel_timer()
        self._resume_reading()
        if not exchange.future.done():
            exchange.future.set_result(None)
        if self._keep and not self.closed:
            self.release(self)
        else:
            self.close()

    def _fail(self, exchange: Exchange, exc: BaseException) -> None:
        self.exchange = None
        exchange.parts.clear()  # up to the limit's worth, kept alive by whatever holds the failed exchange
        for future in (exchange.headed, exchange.future):
            if future is not None and not future.done():
                future.set_exception(exc)
        self.close()

    # -- holds and drains

    def _resume(self) -> None:
        self._timer = None
        self._resume_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _seen(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _why(exc: BaseException | None) -> str:
    return "" if exc is None else f": {type(exc).__name__}: {exc}"
