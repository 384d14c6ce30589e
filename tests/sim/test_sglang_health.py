"""SGLang's /health and /health_generate in-process: one generated token, any scheduler output counts, 503 while
starting, hung or shutting down (sglang#6624 and sglang#22511 are why Pitstop does not trust them alone)."""

from __future__ import annotations

import asyncio

from enginesim.engine import EngineState
from enginesim.sglang import SglangOptions
from enginesim.sglang_api import ServerStatus
from tests.sim.inprocess import inprocess_sglang

OPTIONS = SglangOptions(enable_metrics=True, health_timeout=1)
PATHS = ("/health", "/health_generate")


def test_health_generates_a_token_counted_in_no_metric() -> None:
    async def go() -> None:
        async with inprocess_sglang(OPTIONS) as sim:
            for path in PATHS:
                assert (await sim.client.get(path)).status_code == 200
            assert sim.engine.last_output is not None  # the probes' tokens were generated
            assert sim.engine.in_flight == 0
            labels = {"model_name": "test-model", "engine_type": "unified"}
            for name in ("sglang:num_requests_total", "sglang:generation_tokens_total"):
                for streaming in ("true", "false"):
                    assert sim.registry.get_sample_value(name, {**labels, "is_streaming": streaming}) is None
            assert sim.registry.get_sample_value("sglang:num_aborted_requests_total", labels) is None
    asyncio.run(go())


def test_health_is_503_until_the_warm_up_request_finished() -> None:
    async def go() -> None:
        async with inprocess_sglang(OPTIONS, up=False) as sim:
            for path in (*PATHS, "/ready"):
                assert (await sim.client.get(path)).status_code == 503
            assert (await sim.client.get("/get_model_info")).status_code == 200
            sim.state.status = ServerStatus.UP
            assert (await sim.client.get("/ready")).status_code == 200
    asyncio.run(go())


def test_a_hung_engine_fails_health_generate_and_marks_the_server_unhealthy() -> None:
    async def go() -> None:
        async with inprocess_sglang(OPTIONS) as sim:
            sim.engine.hang()
            assert sim.engine.state is EngineState.HUNG
            for path in PATHS:
                assert (await sim.client.get(path)).status_code == 503
            assert sim.state.status is ServerStatus.UNHEALTHY
            assert sim.engine.in_flight == 0  # each probe is forgotten once it gave up
            assert (await sim.client.get("/ready")).status_code == 503
    asyncio.run(go())


def test_health_answers_503_at_once_while_shutting_down() -> None:
    async def go() -> None:
        async with inprocess_sglang(SglangOptions(health_timeout=3600)) as sim:
            sim.state.shutting_down = True
            sim.engine.hang()  # a probe would wait the whole hour: the answer must come before one is sent
            assert (await asyncio.wait_for(sim.client.get("/health"), 60)).status_code == 503
            assert sim.engine.in_flight == 0
    asyncio.run(go())
