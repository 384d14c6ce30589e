"""Answers read in the loop's callbacks, against a server that sends exactly the bytes a test gives it, split
where the test says: heads and bodies cut anywhere, chunks, trailers, answers that end with the connection,
and the malformed ones a broken or hostile engine sends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from agent.http1 import BodyTooLarge, Connection, Exchange
from agent.plain_http import PlainHttpTransport, Prepared

GET = b"GET /metrics HTTP/1.1\r\nHost: engine\r\n\r\n"
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def sends(*pieces: bytes, close: bool = False, pause: float = 0.01) -> Script:
    """A server that answers each request with ``pieces``, written one by one with a pause between them (so
    that each arrives in a read of its own), then closes the connection when ``close``."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(pause)
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
    return serve


async def exchange(script: Script, requests: int = 1, max_body_bytes: int = 1 << 20,
                   request_timeout: float = 5.0) -> tuple[list[bytes | BaseException], int]:
    """Each request's body (or what it raised) through the transport, and how many connections it opened."""
    server = await asyncio.start_server(script, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = PlainHttpTransport(max_body_bytes=max_body_bytes)
    prepared = Prepared(("127.0.0.1", port), "GET", GET, request_timeout)
    got: list[bytes | BaseException] = []
    try:
        for _ in range(requests):
            try:
                got.append((await transport.fetch(prepared)).body)
            except httpx.HTTPError as exc:
                got.append(exc)
    finally:
        await transport.aclose()
        server.close()
        await server.wait_closed()
    return got, transport.connections_opened


def run(script: Script, **kwargs: object) -> tuple[list[bytes | BaseException], int]:
    return asyncio.run(exchange(script, **kwargs))  # type: ignore[arg-type]


def test_a_head_and_body_cut_anywhere_read_whole_and_the_connection_kept() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world"
    pieces = [answer[:5], answer[5:17], answer[17:40], answer[40:], ]
    got, opened = run(sends(*pieces), requests=3)
    assert got == [b"hello world"] * 3 and opened == 1


def test_chunks_cut_anywhere_with_extensions_and_trailers() -> None:
    body = b"5;name=x\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    pieces = [head + body[:1], body[1:12], body[12:13], body[13:30], body[30:]]
    got, opened = run(sends(*pieces), requests=2)
    assert got == [b"hello world"] * 2 and opened == 1


def test_an_answer_without_length_ends_with_the_connection_which_is_not_kept() -> None:
    got, opened = run(sends(b"HTTP/1.0 200 OK\r\n\r\nfirst ", b"and last", close=True), requests=2)
    assert got == [b"first and last"] * 2 and opened == 2


def test_connection_close_and_http_1_0_are_not_kept() -> None:
    got, opened = run(sends(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"), requests=2)
    assert got == [b"ok"] * 2 and opened == 2


def test_a_kept_connection_the_server_closed_is_replaced_without_an_error() -> None:
    got, opened = run(sends(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", close=True), requests=3)
    assert got == [b"ok"] * 3 and opened == 3


def test_bytes_past_the_answer_mean_the_connection_cannot_be_trusted_again() -> None:
    got, opened = run(sends(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"), requests=2)
    assert got == [b"ok"] * 2 and opened == 2


@pytest.mark.parametrize(("answer", "said"), [
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX", "chunk not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed before the answer was whole"),
])
def test_a_malformed_answer_is_a_read_error_that_names_it(answer: bytes, said: str) -> None:
    (got,), _ = run(sends(answer, close=True))
    assert isinstance(got, httpx.ReadError) and said in str(got)


def test_a_head_without_end_is_refused_past_its_limit() -> None:
    (got,), _ = run(sends(b"HTTP/1.1 200 OK\r\n", b"X-Filler: " + b"a" * 70_000))
    assert isinstance(got, httpx.ReadError) and "head over 65536 bytes" in str(got)


def test_a_body_past_the_limit_fails_as_it_is_announced_or_read() -> None:
    (declared,), _ = run(sends(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n"), max_body_bytes=1000)
    chunk = b"200\r\n" + b"x" * 512 + b"\r\n"
    (endless,), _ = run(sends(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", *[chunk] * 3),
                        max_body_bytes=1000)
    for got in (declared, endless):
        assert isinstance(got, httpx.ReadError) and isinstance(got.__cause__, BodyTooLarge)


def test_an_answer_that_never_comes_is_a_timeout_and_its_connection_dropped() -> None:
    got, opened = run(sends(b"HTTP/1.1 200 OK\r\n", pause=1.0), requests=2, request_timeout=0.2)
    assert all(isinstance(g, httpx.ReadTimeout) for g in got) and opened == 2


def test_a_reader_that_finishes_early_keeps_the_connection_when_the_end_follows() -> None:
    async def scenario() -> tuple[list[bytes], int, int]:
        parts: list[bytes] = []

        def on_part(part: bytes, exchange: Exchange) -> None:
            parts.append(part)
            if b"[DONE]" in part:
                exchange.finish()

        events = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        done = b"e\r\ndata: [DONE]\n\n\r\n"
        server = await asyncio.start_server(sends(events, b"7\r\ndata: 1\r\n", done, b"0\r\n\r\n"), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = PlainHttpTransport()
        prepared = Prepared(("127.0.0.1", port), "GET", GET, 5.0)
        try:
            head = await transport.read(prepared, on_part)
            await asyncio.sleep(0.05)  # the last chunk comes 10 ms after [DONE]
            again = await transport.fetch(Prepared(("127.0.0.1", port), "GET", GET, 5.0))
            return [*parts, again.body], head.status, transport.connections_opened
        finally:
            await transport.aclose()
            server.close()

    parts, status, opened = asyncio.run(scenario())
    assert status == 200 and parts[:2] == [b"data: 1", b"data: [DONE]\n\n"]
    assert opened == 1  # the end came within the drain: the connection served the next request


def test_bytes_no_request_asked_for_close_an_idle_connection() -> None:
    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        released: list[Connection] = []
        server = await asyncio.start_server(sends(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"junk"),
                                            "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, conn = await loop.create_connection(lambda: Connection(loop, released.append), "127.0.0.1", port)
        exchange = conn.send(GET, limit=100, bodiless=False, reused=False)
        await exchange.future
        kept = bool(released) and conn.usable
        await asyncio.sleep(0.05)  # "junk" arrives with no request outstanding
        server.close()
        return kept, conn.usable

    kept, usable_after = asyncio.run(scenario())
    assert kept and not usable_after
