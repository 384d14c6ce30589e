"""A canary round goes with the scrape and is confirmed at once: a frozen API server is judged in two canary
deadlines, a busy one on its counter, and a late canary that streamed a token is progress."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from agent.attached import AttachedReplica
from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.progress import Progress
from agent.wire import ReplicaState
from tests.agent.vllm_text import render

CANARY_TIMEOUT = 0.3


def _agent(tmp_path: Path, handle: httpx.MockTransport) -> tuple[Agent, httpx.AsyncClient]:
    config = AgentConfig.model_validate({
        "node": "n1", "control_plane": None, "gpu_backend": "sim", "sim_gpu_dir": str(tmp_path / "simgpu"),
        "sim_gpu_count": 1, "state_dir": str(tmp_path / "state"), "canary_timeout": CANARY_TIMEOUT,
        "replicas": [{"name": "r0", "model": "m", "url": "http://engine.test:8000", "probe_timeout": 30}]})
    client = httpx.AsyncClient(transport=handle)
    agent = Agent(config, client, SimGpuBackend(tmp_path / "simgpu", 1))
    agent.replicas["r0"].machine.to(ReplicaState.ATTACHED, "health 200")
    return agent, client


def _judged(tmp_path: Path, handle: httpx.MockTransport) -> tuple[AttachedReplica, float]:
    """One pass and its canary round against the engine ``handle`` plays; the replica after it, and how long."""
    async def scenario() -> tuple[AttachedReplica, float]:
        agent, client = _agent(tmp_path, handle)
        async with client:
            took = await _round(agent)
        replica = agent.replicas["r0"]
        assert isinstance(replica, AttachedReplica)
        return replica, took

    return asyncio.run(scenario())


async def _round(agent: Agent) -> float:
    """One pass and its canary round; how long the round took (loop time)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await agent.collect_once()
    await asyncio.gather(*agent.canaries.in_flight.values())
    took = loop.time() - started
    for task in agent._collecting.values():
        task.cancel()
    return took


def test_a_frozen_api_server_is_wedged_in_two_canary_deadlines_not_its_reads_timeouts(tmp_path: Path) -> None:
    async def frozen(_request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)  # accepted, never answered: a SIGSTOPped API server
        raise AssertionError("unreachable")

    replica, took = _judged(tmp_path, httpx.MockTransport(frozen))
    assert replica.wedged and replica.progress.last is Progress.WEDGED
    assert "/metrics unanswered since the first canary" in replica.progress.summary()
    # Two deadlines (0.6 s); the reads' own 30 s timeout was never waited for.
    assert took < 10, took


def test_a_busy_api_server_that_answers_its_metrics_late_is_judged_on_the_counter(tmp_path: Path) -> None:
    tokens = [100.0]

    async def busy(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            await asyncio.sleep(CANARY_TIMEOUT * 1.5)  # late, but answered while the round runs
            tokens[0] += 50  # other users' tokens keep coming
            return httpx.Response(200, text=render("m", generation_tokens=tokens[0]))
        await asyncio.sleep(3600)  # the canary waits in a long queue
        raise AssertionError("unreachable")

    replica, _ = _judged(tmp_path, httpx.MockTransport(busy))
    assert not replica.wedged and replica.progress.last is Progress.BUSY
    assert replica.canary_ok is False


def test_a_late_canary_that_streamed_a_token_is_progress_whatever_the_counter(tmp_path: Path) -> None:
    async def one_token_then_nothing() -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"text": "a"}]}\n\n'
        await asyncio.sleep(3600)

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=render("m", generation_tokens=7.0))  # flat: read before the token
        return httpx.Response(200, content=one_token_then_nothing(), headers={"content-type": "text/event-stream"})

    replica, _ = _judged(tmp_path, httpx.MockTransport(slow))
    assert replica.canary_ok is False and replica.canary_ttft is not None
    assert replica.progress.last is Progress.BUSY and replica.progress.streak == 0


def test_an_api_server_that_froze_after_the_rounds_first_read_is_wedged_without_waiting_out_scrape_timeouts(
        tmp_path: Path) -> None:
    # The round's own /metrics read was answered; then the API server froze (its canary and every later read hang
    # until the client's timeout, as a real transport ends them). Each later read is waited for as long as a
    # verdict's canaries take, not the replica's 30 s probe timeout.
    reads = 0
    waited: list[float] = []

    async def froze_after_one_read(request: httpx.Request) -> httpx.Response:
        nonlocal reads
        if request.url.path == "/metrics" and reads == 0:
            reads += 1
            return httpx.Response(200, text=render("m", generation_tokens=500.0))
        timeout = request.extensions["timeout"]["read"]
        waited.append(timeout)
        await asyncio.sleep(timeout)
        raise httpx.ReadTimeout("timed out", request=request)

    replica, _ = _judged(tmp_path, httpx.MockTransport(froze_after_one_read))
    assert replica.wedged and replica.progress.last is Progress.WEDGED
    # The canaries waited their deadline; the counter reads around them two deadlines at most.
    assert waited and max(waited) <= 2 * CANARY_TIMEOUT, waited
