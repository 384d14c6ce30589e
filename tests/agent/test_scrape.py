"""Scraping an engine through an injected httpx client: errors become scrape_error, stalls are detected."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse

from agent.config import AgentConfig, ReplicaConfig
from agent.gpu.sim import SimGpuBackend
from agent.lean_client import scrape_client
from agent.node import Agent
from agent.scrape import EngineScraper
from agent.wire import EngineSample
from tests.agent.conftest import ControlPlaneStandIn
from tests.agent.vllm_text import render
from tests.helpers import free_port, wait_until


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scraper_for(bodies: list[str | Exception], clock: Clock) -> EngineScraper:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        body = bodies.pop(0)
        if isinstance(body, Exception):
            raise body
        return httpx.Response(200, text=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return EngineScraper(client, "http://engine:8000", "m", clock)


def run(scraper: EngineScraper, clock: Clock, step: float = 5.0) -> EngineSample:
    clock.t += step
    return asyncio.run(scraper.scrape())


def test_timeout_and_garbage_become_scrape_errors_and_are_counted() -> None:
    clock = Clock()
    scraper = scraper_for([httpx.ReadTimeout("slow"), "<html>oops</html>", render(generation_tokens=5)], clock)
    first = run(scraper, clock)
    assert first.scrape_error is not None and "ReadTimeout" in first.scrape_error
    second = run(scraper, clock)
    assert second.scrape_error is not None and "unparsable" in second.scrape_error
    third = run(scraper, clock)
    assert third.scrape_error is None and third.generation_tokens_total == 5
    assert scraper.errors_total == 2


def test_the_agents_own_aborted_canaries_are_no_users_errors_and_a_credit_lasts_one_window() -> None:
    # Scrapes 5 s apart. The engine counts an abort when it notices the closed connection: in the window the
    # agent cut its canary, or the next. One it never counts (a frozen API server never read the request) must
    # not hide a user's error later.
    clock = Clock()
    aborts = [0, 2, 5, 5, 6, 6, 6, 7]  # the engine's finished_reason="abort" counter at each scrape
    scraper = scraper_for([render(success={"stop": 100, "abort": a}) for a in aborts], clock)

    def errors(own: int) -> float | None:
        clock.t += 5.0
        return asyncio.run(scraper.scrape(own_aborts=own)).errors_per_second

    assert errors(0) is None  # the first reading has no window
    assert errors(2) == 0.0  # both aborts of the window were the agent's canaries
    assert errors(3) == pytest.approx(2 / 5)  # 3 new aborts, 1 of them a canary: 2 users' errors
    assert errors(4) == 0.0  # a canary cut that the engine has not counted yet ...
    assert errors(4) == 0.0  # ... is left out of the next window, where it shows
    assert errors(5) == 0.0  # a canary the engine never counts ...
    assert errors(5) == 0.0
    assert errors(5) == pytest.approx(1 / 5)  # ... is carried one window, not forever: a user's abort shows


def test_http_error_status_is_a_scrape_error() -> None:
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500, text="engine dead")))
    sample = asyncio.run(EngineScraper(client, "http://e", "m", lambda: 0.0).scrape())
    assert sample.scrape_error is not None and "500" in sample.scrape_error


@pytest.mark.parametrize(("tokens_after", "running", "stalled"), [(100, 3, True), (160, 3, False), (100, 0, False)])
def test_stall_is_work_queued_while_tokens_do_not_move(tokens_after: int, running: int, stalled: bool) -> None:
    clock = Clock()
    scraper = scraper_for([render(generation_tokens=100, running=running),
                           render(generation_tokens=tokens_after, running=running)], clock)
    assert run(scraper, clock).stalled is None  # one scrape cannot tell
    assert run(scraper, clock).stalled is stalled


def test_an_unchanged_body_reads_as_the_same_figures_and_only_wanted_series_are_asked_for() -> None:
    seen: list[httpx.Request] = []
    body = render(running=2, generation_tokens=40)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=body)

    clock = Clock()
    scraper = EngineScraper(httpx.AsyncClient(transport=httpx.MockTransport(handler)), "http://e", "m", clock)
    first, second = run(scraper, clock), run(scraper, clock)
    assert first.requests_running == second.requests_running == 2
    assert second.generation_tokens_per_second == 0.0  # a window without a token
    assert second.stalled is True  # work running and nothing moved: the same verdict parsing would give
    asked = seen[0].url.params.get_list("name[]")
    assert "vllm:num_requests_running" in asked and "vllm:time_to_first_token_seconds_bucket" in asked


def test_a_repeated_series_is_a_scrape_error_never_a_sum() -> None:
    clock = Clock()
    repeated = 'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n' * 100_000
    scraper = scraper_for([render(running=3, generation_tokens=5) + repeated, render(running=3)], clock)
    first = run(scraper, clock)
    assert first.requests_running is None
    assert first.scrape_error == ('engine /metrics refused: duplicate series vllm:num_requests_running{engine="0",'
                                  'model_name="m"}: the same name and labels twice in one body')
    assert run(scraper, clock).requests_running == 3  # the next honest body reads as it is
    assert scraper.errors_total == 1


# ---- against a real HTTP server --------------------------------------------------------------------------------

HONEST = render(running=2, generation_tokens=40)


def make_engines() -> FastAPI:
    """Two engines on one server: /good/* answers honestly, /endless/* streams /metrics without end."""
    app = FastAPI()

    @app.get("/{engine}/health")
    async def health(engine: str) -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/good/metrics")
    async def good() -> PlainTextResponse:
        return PlainTextResponse(HONEST)

    @app.get("/endless/metrics")
    async def endless() -> StreamingResponse:
        async def parts() -> AsyncIterator[str]:
            line = 'vllm:num_requests_running{engine="0",model_name="m"} 3\n' * 4000
            while True:  # chunked, no length, no end
                yield line
                await asyncio.sleep(0)  # a disconnected client ends it (uvicorn's send no longer waits then)
        return StreamingResponse(parts(), media_type="text/plain")

    return app


@pytest.fixture(scope="module")
def engines() -> Iterator[str]:
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(make_engines(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, 10, what="engines")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


TOO_LARGE = "engine /metrics body over 16777216 bytes"


@pytest.mark.parametrize("transport", ["plain", "httpx"])  # the agent's loopback transport; httpx's (https)
def test_an_endless_body_is_a_scrape_error_and_the_other_engine_reads_on(engines: str, transport: str) -> None:
    async def scenario() -> tuple[list[EngineSample], list[EngineSample], int]:
        client = scrape_client() if transport == "plain" else httpx.AsyncClient()
        async with client:
            endless = EngineScraper(client, f"{engines}/endless", "m", lambda: 0.0)
            good = EngineScraper(client, f"{engines}/good", "m", lambda: 0.0)
            bad, fine = [], []
            for _ in range(2):
                got = await asyncio.gather(endless.scrape(), good.scrape())
                bad.append(got[0])
                fine.append(got[1])
        return bad, fine, endless.errors_total

    bad, fine, errors = asyncio.run(scenario())
    assert [s.scrape_error for s in bad] == [TOO_LARGE, TOO_LARGE] and errors == 2
    assert all(s.requests_running is None for s in bad)
    assert [(s.scrape_error, s.requests_running) for s in fine] == [(None, 2), (None, 2)]


def test_an_agent_with_an_endless_engine_keeps_reporting(engines: str, tmp_path: Path,
                                                         control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, url = control_plane
    config = AgentConfig(
        node="test-node", port=free_port(), control_plane=url, gpu_backend="sim", sim_gpu_dir=tmp_path / "gpu",
        state_dir=tmp_path / "state", scrape_interval=0.3, report_interval=0.3,
        replicas=[ReplicaConfig(name="endless", url=f"{engines}/endless", model="m"),
                  ReplicaConfig(name="good", url=f"{engines}/good", model="m")])

    async def scenario() -> int:
        stop = asyncio.Event()
        async with httpx.AsyncClient() as client, scrape_client() as scraper, scrape_client() as reports:
            agent = Agent(config, client, SimGpuBackend(config.sim_gpu_dir, 1), scrape_client=scraper,
                          report_client=reports)
            task = asyncio.create_task(agent.run(stop))
            # One report every 0.3 s, scrapes and canaries beside: eight reports and five refused scrapes take
            # about 3 s. Waited for, not timed: a stalled agent never gets there (tracemalloc slows it down).
            try:
                with contextlib.suppress(TimeoutError):  # the asserts below say what did not come
                    async with asyncio.timeout(60):
                        # Two counters, one of them in another thread: nothing to wait on but a poll.
                        while len(stand_in.reports) < 8 or agent.scrapers["endless"].errors_total < 5:  # noqa: ASYNC110
                            await asyncio.sleep(0.1)
            finally:
                stop.set()
                await task
            return agent.scrapers["endless"].errors_total

    tracemalloc.start()
    try:
        errors = asyncio.run(scenario())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(stand_in.reports) >= 8, "reports stalled"
    last = {r.name: r for r in stand_in.reports[-1].replicas}
    assert last["endless"].engine is not None and last["endless"].engine.scrape_error == TOO_LARGE
    assert last["good"].engine is not None and last["good"].engine.requests_running == 2
    assert last["good"].engine.scrape_error is None
    assert errors >= 5
    assert peak < 96 * 2**20, f"the agent held {peak / 2**20:.0f} MiB"  # a few capped reads at once (~26), no more
