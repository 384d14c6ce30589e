"""Scraping an engine through an injected httpx client: errors become scrape_error, stalls are detected."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agent.scrape import EngineScraper
from agent.wire import EngineSample
from tests.agent.vllm_text import render


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
