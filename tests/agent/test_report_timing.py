"""When the agent reports: right after the collector's pass, so a report carries figures read a moment ago."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.reporter import Reporter

CP = "http://cp.example:8000"


def run_agent(tmp_path: Path, scrape: float, report: float, passes: int) -> tuple[list[float], list[float]]:
    """Loop times at which the collector's passes ended and reports were sent, over ``passes`` passes."""
    config = AgentConfig.model_validate({"node": "n1", "control_plane": None, "gpu_backend": "sim",
                                         "sim_gpu_count": 0, "scrape_interval": scrape, "report_interval": report,
                                         "state_dir": str(tmp_path / "state")})
    ended: list[float] = []
    sent: list[float] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def handler(_request: httpx.Request) -> httpx.Response:
            sent.append(loop.time())
            return httpx.Response(200, json={"node": "n1"})

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            agent = Agent(config, client, SimGpuBackend(tmp_path / "gpus", 0))
            agent.reporter = Reporter(client, CP, "n1")
            collect = agent.collect_once

            async def counted() -> None:
                await collect()
                ended.append(loop.time())
                if len(ended) >= passes:
                    stop.set()

            agent.collect_once = counted  # type: ignore[method-assign]
            await asyncio.wait_for(asyncio.gather(agent._collect_loop(stop), agent._report_loop(stop)), timeout=30)

    asyncio.run(scenario())
    return ended, sent


def test_a_report_goes_with_the_pass_that_just_ended(tmp_path: Path) -> None:
    ended, sent = run_agent(tmp_path, scrape=0.2, report=0.2, passes=8)
    # The first report goes at start, before any pass; the pass a moment after it (the first tick) and the
    # last (the test stops there) have none of their own.
    later = sent[1:]
    assert len(later) >= len(ended) - 3  # one report per pass, none skipped
    for at in later:
        last_pass = max(e for e in ended if e <= at)
        assert at - last_pass < 0.05  # the pass's figures, not ones up to a scrape interval old


def test_reports_due_more_often_than_passes_keep_their_own_interval(tmp_path: Path) -> None:
    ended, sent = run_agent(tmp_path, scrape=0.5, report=0.1, passes=3)
    assert len(sent) >= 2 * len(ended)  # every 0.1 s, not once per 0.5 s pass


def test_reports_less_often_than_passes_go_with_every_nth_pass(tmp_path: Path) -> None:
    ended, sent = run_agent(tmp_path, scrape=0.1, report=0.3, passes=12)
    later = sent[1:]
    assert 3 <= len(later) <= 5  # one per three passes
    for at in later:
        assert at - max(e for e in ended if e <= at) < 0.05
