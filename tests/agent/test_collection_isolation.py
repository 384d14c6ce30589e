"""One engine that answers nothing (its API server frozen) holds back no other replica's reading, nor the pass."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx

from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.wire import ReplicaState
from tests.agent.vllm_text import render

SSE = b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n'
FROZEN = "engine-7.test"


def test_one_frozen_engine_of_eight_leaves_the_other_seven_read_every_pass(tmp_path: Path) -> None:
    served: Counter[str] = Counter()  # /metrics answers per engine host
    release = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host == FROZEN:  # connection accepted, nothing answered: what a SIGSTOPped API server does
            await release.wait()
        if request.url.path == "/metrics":
            served[host] += 1
            return httpx.Response(200, text=render("m", generation_tokens=float(served[host])))
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})

    config = AgentConfig.model_validate({
        "node": "n1", "control_plane": None, "gpu_backend": "sim", "sim_gpu_dir": str(tmp_path / "simgpu"),
        "sim_gpu_count": 1, "state_dir": str(tmp_path / "state"), "scrape_interval": 0.4,
        "replicas": [{"name": f"r{i}", "model": "m", "url": f"http://engine-{i}.test:8000"} for i in range(8)]})

    async def scenario() -> tuple[list[dict[str, float | None]], float]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            agent = Agent(config, client, SimGpuBackend(tmp_path / "simgpu", 1))
            for replica in agent.replicas.values():
                replica.machine.to(ReplicaState.ATTACHED, "health 200")
            loop = asyncio.get_running_loop()
            started = loop.time()
            passes = []
            for _ in range(5):
                await agent.collect_once()
                passes.append({n: (r.engine.generation_tokens_total if r.engine else None)
                               for n, r in agent.replicas.items()})
            took = loop.time() - started
            # The report that goes with the last pass carries the seven's readings of that pass.
            report = {r.name: r.engine.generation_tokens_total if r.engine else None
                      for r in agent.build_report().replicas}
            assert report == passes[-1]
            release.set()
            agent.canaries.cancel()
            for task in agent._collecting.values():
                task.cancel()
            return passes, took

    passes, took = asyncio.run(scenario())
    # The seven were read in every pass (their counter is the number of reads they answered); the frozen one's
    # reading never came, and its scrape was not started again while the first waited.
    for i, seen in enumerate(passes, start=1):
        assert {n: seen[n] for n in seen if n != "r7"} == {f"r{k}": float(i) for k in range(7)}, seen
        assert seen["r7"] is None
    assert served[FROZEN] == 0
    # Five passes, each waiting half an interval (0.2 s) for the frozen engine at most: the scrape's own 10 s
    # timeout held every pass before.
    assert took < 5.0, took


def test_a_read_still_open_an_interval_later_is_reported_as_unread_not_as_its_last_figures(tmp_path: Path) -> None:
    # Reports go out more often than scrapes: one engine's last figures, sent again while its /metrics hangs,
    # would read at the control plane as a counter standing still (a stall of a replica still READY).
    frozen = asyncio.Event()
    release = asyncio.Event()
    served = 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal served
        if frozen.is_set():
            await release.wait()
        if request.url.path == "/metrics":
            served += 1
            return httpx.Response(200, text=render("m", generation_tokens=100.0 * served))
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})

    config = AgentConfig.model_validate({
        "node": "n1", "control_plane": None, "gpu_backend": "sim", "sim_gpu_dir": str(tmp_path / "simgpu"),
        "sim_gpu_count": 1, "state_dir": str(tmp_path / "state"), "scrape_interval": 0.4, "canary_every": 0,
        "replicas": [{"name": "r0", "model": "m", "url": "http://engine-0.test:8000"}]})

    def reported(agent: Agent) -> tuple[float | None, str | None]:
        [status] = agent.build_report().replicas
        assert status.engine is not None
        return status.engine.generation_tokens_total, status.engine.scrape_error

    async def scenario() -> list[tuple[float | None, str | None]]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            agent = Agent(config, client, SimGpuBackend(tmp_path / "simgpu", 1))
            [replica] = agent.replicas.values()
            replica.machine.to(ReplicaState.ATTACHED, "health 200")
            seen = []
            await agent.collect_once()
            seen.append(reported(agent))
            frozen.set()
            await agent.collect_once()  # its read hangs: the pass goes on after half an interval
            seen.append(reported(agent))
            await agent.collect_once()  # an interval later the read is still open
            seen.append(reported(agent))
            frozen.clear()
            release.set()
            await agent.collect_once()  # the open read lands; the next pass reads again
            await agent.collect_once()
            seen.append(reported(agent))
            for task in agent._collecting.values():
                task.cancel()
            return seen

    first, hung, overdue, back = asyncio.run(scenario())
    assert first == (100.0, None)
    assert hung == (100.0, None)  # within its interval: the last reading stands, as for any slow engine
    assert overdue[0] is None and overdue[1] is not None and "unanswered for" in overdue[1], overdue
    assert back[0] is not None and back[0] > 100.0 and back[1] is None, back
