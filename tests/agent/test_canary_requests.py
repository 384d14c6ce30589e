"""What a canary costs the engine and the agent: the scrape's counter read stands for its "before", and its
request is built once; its streamed answer still gives TTFT and the verdict."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from agent.attached import AttachedReplica
from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.wire import ReplicaState
from tests.agent.vllm_text import render

SSE = (b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b"}]}\n\n'
       b"data: [DONE]\n\n")


def _agent(tmp_path: Path, handler: httpx.MockTransport, **settings: object) -> tuple[Agent, httpx.AsyncClient]:
    config = AgentConfig.model_validate({
        **settings, "node": "n1", "control_plane": None, "gpu_backend": "sim", "sim_gpu_dir": str(tmp_path / "simgpu"),
        "sim_gpu_count": 1, "state_dir": str(tmp_path / "state"),
        "replicas": [{"name": "r0", "model": "m", "url": "http://engine.test:8000"}]})
    client = httpx.AsyncClient(transport=handler)
    agent = Agent(config, client, SimGpuBackend(tmp_path / "simgpu", 1))
    agent.replicas["r0"].machine.to(ReplicaState.ATTACHED, "health 200")
    return agent, client


async def _ticks(agent: Agent, n: int) -> None:
    for _ in range(n):
        await agent.collect_once()
        await asyncio.gather(*agent.canaries.in_flight.values())


def test_a_canary_after_a_good_scrape_reads_no_metrics_of_its_own(tmp_path: Path) -> None:
    seen: list[str] = []
    requests: list[httpx.Request] = []
    tokens = [10.0]

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        requests.append(request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=render("m", generation_tokens=tokens[0]))
        tokens[0] += 2
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})

    async def scenario() -> Agent:
        agent, client = _agent(tmp_path, httpx.MockTransport(handle))
        async with client:
            await _ticks(agent, 3)
        return agent

    agent = asyncio.run(scenario())
    assert seen == ["/metrics", "/v1/completions"] * 3  # one /metrics read per interval, the scrape's
    replica = agent.replicas["r0"]
    assert replica.canary_ok is True and replica.canary_ttft is not None
    canaries = [r for r in requests if r.url.path == "/v1/completions"]
    assert len({id(r) for r in canaries}) == 1  # built once, sent every interval


def test_a_canary_whose_scrape_failed_is_confirmed_at_once_and_judged_on_the_counter_between(tmp_path: Path) -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/metrics":
            # The scrape fails (a body that is not /metrics): the first canary has no "before". The reads after
            # each canary find the counter flat.
            if seen.count("/metrics") == 1:
                return httpx.Response(200, text="garbage\n")
            return httpx.Response(200, text=render("m", generation_tokens=10.0))
        return httpx.Response(503, text="overloaded")

    async def scenario() -> Agent:
        agent, client = _agent(tmp_path, httpx.MockTransport(handle))
        async with client:
            await _ticks(agent, 1)
        return agent

    agent = asyncio.run(scenario())
    # The scrape and the canary; the counter after it, read beside the confirming canary sent at once; the
    # counter after that one. No read of a "before" of its own: a failed scrape leaves it unknown.
    assert seen[:2] == ["/metrics", "/v1/completions"] and seen[-1] == "/metrics"
    assert sorted(seen) == ["/metrics"] * 3 + ["/v1/completions"] * 2
    replica = agent.replicas["r0"]
    assert isinstance(replica, AttachedReplica)
    assert replica.canary_ok is False
    assert replica.wedged  # the first unreadable, the second flat: two in a row with no token moving


def _counting_handler(seen: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=render("m", generation_tokens=float(len(seen))))
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle)


def test_canaries_go_every_canary_interval_not_every_scrape(tmp_path: Path) -> None:
    """Scraped every second, a replica gets its canary every 5 s (the default): the first scrape, then every
    fifth; a canary is a request the engine serves, so a faster scrape does not mean more of them."""
    seen: list[str] = []

    async def scenario() -> None:
        agent, client = _agent(tmp_path, _counting_handler(seen), scrape_interval=1.0)
        async with client:
            await _ticks(agent, 11)

    asyncio.run(scenario())
    assert seen.count("/metrics") == 11
    assert seen.count("/v1/completions") == 3  # scrapes 1, 6 and 11
    assert seen[:2] == ["/metrics", "/v1/completions"]


def test_canary_every_counts_scrapes_and_zero_turns_canaries_off(tmp_path: Path) -> None:
    for settings, canaries in (({"scrape_interval": 1.0, "canary_every": 2}, 3),
                               ({"scrape_interval": 1.0, "canary_interval": 0}, 0),
                               ({"scrape_interval": 0.5, "canary_interval": 1.0}, 3),
                               ({"scrape_interval": 10.0}, 5)):  # never less than one per scrape
        seen: list[str] = []

        async def scenario(settings: dict[str, object] = settings, seen: list[str] = seen) -> None:
            agent, client = _agent(tmp_path, _counting_handler(seen), **settings)
            async with client:
                await _ticks(agent, 5)

        asyncio.run(scenario())
        assert seen.count("/v1/completions") == canaries, settings
