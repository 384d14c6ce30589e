"""The scrape transport against a real HTTP server: bodies, keep-alive, stale connections, errors, timeouts."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator

import httpx
import pytest
import uvicorn
import uvloop
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from agent.http1 import Connection
from agent.lean_client import scrape_client
from agent.plain_http import STREAM, BodyTooLarge, PlainHttpTransport
from agent.probes import CompletionResult, completion_request, stream_completion
from agent.ticks import until_tick
from tests.helpers import free_port, wait_until

BODY = "vllm:num_requests_running 3\n" * 2000
# Set by the test once it holds the first event: the server sends the second only then (or "late" if never).
RELEASED = threading.Event()


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse(BODY, headers={"x-encoding-asked": request.headers.get("accept-encoding", "")})

    @app.get("/chunked")
    async def chunked() -> StreamingResponse:
        async def parts() -> object:
            for i in range(5):
                yield f"part{i};"
        return StreamingResponse(parts(), media_type="text/plain")  # type: ignore[arg-type]

    @app.get("/endless")
    async def endless() -> StreamingResponse:
        async def parts() -> object:
            line = "vllm:num_requests_running 3\n" * 4000
            while True:  # an engine that never stops sending (chunked, no length)
                yield line
                await asyncio.sleep(0)  # let the server see the client hang up
        return StreamingResponse(parts(), media_type="text/plain")  # type: ignore[arg-type]

    @app.get("/events")
    async def events() -> StreamingResponse:
        async def parts() -> object:
            yield "data: first\n\n"
            released = await asyncio.to_thread(RELEASED.wait, 10)
            yield "data: second\n\n" if released else "data: late\n\n"
        return StreamingResponse(parts(), media_type="text/event-stream")  # type: ignore[arg-type]

    @app.post("/v1/completions")
    async def tokens(request: Request) -> StreamingResponse:
        gap = float(request.query_params.get("gap", "0.01"))

        async def parts() -> object:
            for i in range(4):  # one event per token, as vLLM streams them
                yield f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n'
                await asyncio.sleep(gap)
            yield "data: [DONE]\n\n"
        return StreamingResponse(parts(), media_type="text/event-stream")  # type: ignore[arg-type]

    @app.post("/echo")
    async def echo(request: Request) -> PlainTextResponse:
        return PlainTextResponse((await request.body()).decode(), status_code=201)

    @app.get("/slow")
    async def slow() -> PlainTextResponse:
        await asyncio.sleep(2)
        return PlainTextResponse("late")

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    # A short keep-alive timeout, so the stale-connection path is reachable in a second.
    srv = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="warning",
                                        timeout_keep_alive=1))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, 10, what="test server")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_bodies_keep_alive_and_no_compression(server: str) -> None:
    async def scenario() -> tuple[list[httpx.Response], int]:
        transport = PlainHttpTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            got = [await client.get(f"{server}/metrics") for _ in range(5)]
            got.append(await client.get(f"{server}/chunked"))
            got.append(await client.post(f"{server}/echo", content=b"hello"))
        return got, transport.connections_opened

    responses, opened = run(scenario())  # type: ignore[misc]
    assert all(r.text == BODY for r in responses[:5])
    assert responses[0].headers["x-encoding-asked"] == "identity"
    assert responses[5].text == "part0;part1;part2;part3;part4;"
    assert (responses[6].status_code, responses[6].text) == (201, "hello")
    assert opened == 1  # one keep-alive connection for all seven requests


def test_a_connection_the_server_closed_is_replaced(server: str) -> None:
    async def scenario() -> tuple[str, int]:
        transport = PlainHttpTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(f"{server}/metrics")
            await asyncio.sleep(1.6)  # past the server's keep-alive timeout: it closes the idle connection
            second = await client.get(f"{server}/metrics")
        return second.text, transport.connections_opened

    text, opened = run(scenario())  # type: ignore[misc]
    assert text == BODY and opened == 2


def test_refused_and_timeout_are_httpx_errors(server: str) -> None:
    async def refused() -> None:
        async with httpx.AsyncClient(transport=PlainHttpTransport()) as client:
            await client.get(f"http://127.0.0.1:{free_port()}/metrics")

    async def slow() -> None:
        async with httpx.AsyncClient(transport=PlainHttpTransport()) as client:
            await client.get(f"{server}/slow", timeout=0.3)

    with pytest.raises(httpx.ConnectError):
        run(refused())
    with pytest.raises(httpx.ReadTimeout):
        run(slow())


def test_https_is_refused_so_it_can_be_mounted_for_http_only() -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(transport=PlainHttpTransport()) as client:
            await client.get("https://127.0.0.1:1/metrics")

    with pytest.raises(httpx.UnsupportedProtocol):
        run(scenario())


def test_a_body_past_the_limit_is_an_error_and_never_read_whole(server: str) -> None:
    async def scenario(path: str) -> BaseException | None:
        async with httpx.AsyncClient(transport=PlainHttpTransport(max_body_bytes=20_000)) as client:
            try:
                await client.get(f"{server}{path}", timeout=10)
            except httpx.ReadError as exc:
                return exc.__cause__
        return None

    declared = run(scenario("/metrics"))  # Content-Length 56,000: refused before the body is read
    assert isinstance(declared, BodyTooLarge) and "56000 bytes is over 20000" in str(declared)
    endless = run(scenario("/endless"))  # chunked without end: refused at the first chunk past the limit
    assert isinstance(endless, BodyTooLarge) and "over 20000 bytes" in str(endless)


def test_a_streamed_body_is_handed_on_as_it_arrives_and_its_connection_kept(server: str) -> None:
    async def scenario() -> tuple[list[bytes], str, int]:
        RELEASED.clear()
        transport = PlainHttpTransport()
        parts: list[bytes] = []
        async with httpx.AsyncClient(transport=transport) as client:
            request = client.build_request("GET", f"{server}/events", timeout=20, extensions={STREAM: True})
            response = await client.send(request, stream=True)
            async for part in response.aiter_bytes():
                parts.append(part)
                RELEASED.set()  # the first event came before the server sent the second
            await response.aclose()
            after = (await client.get(f"{server}/metrics")).text
        return parts, after, transport.connections_opened

    parts, after, opened = asyncio.run(scenario())
    assert b"".join(parts) == b"data: first\n\ndata: second\n\n"
    assert after == BODY
    assert opened == 1  # read to its end, the streamed connection served the next request


def test_a_streamed_body_left_unread_closes_its_connection(server: str) -> None:
    async def scenario() -> int:
        RELEASED.clear()
        transport = PlainHttpTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            request = client.build_request("GET", f"{server}/events", timeout=20, extensions={STREAM: True})
            response = await client.send(request, stream=True)
            async for _ in response.aiter_bytes():
                break  # the caller stops at the first event, the server still holds the second
            await response.aclose()
            RELEASED.set()
            assert (await client.get(f"{server}/metrics")).text == BODY
        return transport.connections_opened

    assert asyncio.run(scenario()) == 2  # the half-read connection was not reused


def test_a_canary_gathers_the_rest_of_its_answer_in_one_read_after_the_first_token(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    feed = Connection.data_received

    def counted(self: Connection, data: bytes) -> None:
        reads.append(len(data))
        feed(self, data)

    monkeypatch.setattr(Connection, "data_received", counted)

    async def canary(gap: float, gather: float, limit: float = 5.0) -> tuple[CompletionResult, int, int]:
        async with scrape_client() as client:
            request = completion_request(client, server, "m", "ping", 4, limit)
            request.url = request.url.copy_with(query=f"gap={gap}".encode())
            reads.clear()
            result = await stream_completion(client, server, "m", "ping", 4, limit, time.monotonic,
                                             request=request, gather_seconds=gather)
            return result, len(reads), client.plain.connections_opened

    gathered, gathered_reads, opened = asyncio.run(canary(0.01, 0.2))
    one_by_one, plain_reads, _ = asyncio.run(canary(0.01, 0.0))
    assert gathered.ok and one_by_one.ok and gathered.ttft_seconds is not None
    assert gathered.ttft_seconds < 0.2  # TTFT is still the first token, not the end of the gathering
    assert plain_reads >= 5 and gathered_reads <= 3  # head, first token, then the rest at once
    assert opened == 1  # read to its end: the connection is kept
    # An answer slower than the window is read on as it arrives, whole, before the same deadline.
    slow, _, _ = asyncio.run(canary(0.15, 0.05))
    assert slow.ok
    late, _, _ = asyncio.run(canary(0.5, 0.05, limit=1.0))
    assert not late.ok and late.error == "no completion within 1s" and late.ttft_seconds is not None


def test_canaries_gathering_at_once_resume_on_the_same_tick(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where each gather's hold ends on the loop's clock is what the test reads.
    ends: list[float] = []
    hold = Connection.hold

    def recorded(self: Connection, until: float) -> None:
        ends.append(until)
        hold(self, until)

    monkeypatch.setattr(Connection, "hold", recorded)

    async def two_canaries() -> list[CompletionResult]:
        async with scrape_client() as client:
            request = completion_request(client, server, "m", "ping", 4, 5.0)
            loop = asyncio.get_running_loop()
            # Sent just past a tick, so that both first tokens (a few milliseconds later) fall before the next one.
            await asyncio.sleep(until_tick(loop.time(), 0.05) + 0.002)
            return list(await asyncio.gather(*(
                stream_completion(client, server, "m", "ping", 4, 5.0, time.monotonic, request=request,
                                  gather_seconds=0.05) for _ in range(2))))

    results = asyncio.run(two_canaries())
    assert all(r.ok for r in results)
    assert len(ends) == 2
    # On a tick of the gather, the same one for both: one wakeup for all of them.
    (tick,) = {round(end / 0.05) for end in ends}
    assert all(abs(end - 0.05 * tick) < 1e-6 for end in ends)


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_canary_that_stops_at_done_leaves_nothing_for_the_loop_to_finalize(
        server: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    # An async generator dropped unfinished is closed by the loop (through its finalizer hook, then a wakeup and
    # a task per canary); on both loops, the agent's (uvloop) and asyncio's own.
    async def canaries() -> tuple[list[CompletionResult], int]:
        hooks = sys.get_asyncgen_hooks()
        finalized = 0

        def counted(agen: AsyncGenerator[object, None]) -> None:
            nonlocal finalized
            finalized += 1
            assert hooks.finalizer is not None
            hooks.finalizer(agen)

        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=counted)
        try:
            async with scrape_client() as client:
                request = completion_request(client, server, "m", "ping", 4, 5.0)
                results = []
                for gather in (0.0, 0.05, 0.0):
                    results.append(await stream_completion(client, server, "m", "ping", 4, 5.0, time.monotonic,
                                                           request=request, gather_seconds=gather))
                    await asyncio.sleep(0.01)  # a dropped generator is finalized by now
            return results, finalized
        finally:
            sys.set_asyncgen_hooks(*hooks)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        results, finalized = runner.run(canaries())
    assert all(r.ok for r in results)
    assert finalized == 0
