"""The slow all-reduce fault: tensor-parallel engines on the custom all-reduce pay it every step, NCCL does not.

The engines run on a virtual clock, so the figures are the timing model's own and exact.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from enginesim.cli import serve_config
from enginesim.clock import VirtualClock
from enginesim.engine import Token
from enginesim.faults import FaultConfig, all_reduce_penalty_seconds
from enginesim.profiles import TINY_CPU
from enginesim.server import ServeConfig, build_engine

SLOW = FaultConfig(slow_all_reduce_ms=150.0)
LABELS = {"model_name": "test-model", "engine": "0"}


@dataclass(frozen=True)
class Run:
    token_gaps: list[float]  # between the tokens of one request, as its client sees them
    itl_mean: float  # what /metrics reports: vllm:inter_token_latency_seconds sum / count
    itl_count: float


def _run(*, tp: int, disable_custom_all_reduce: bool, faults: FaultConfig = SLOW, requests: int = 4,
         max_tokens: int = 10) -> Run:
    """Serve ``requests`` concurrent requests on a warm engine built from a ServeConfig, on a virtual clock."""
    config = ServeConfig(model="test-model", profile=TINY_CPU, tensor_parallel_size=tp,
                         disable_custom_all_reduce=disable_custom_all_reduce, faults=faults)
    registry = CollectorRegistry()

    async def go() -> list[float]:
        clock = VirtualClock()
        engine = build_engine(config, registry, clock)
        engine.steps = TINY_CPU.warmup_steps  # measure the warm engine
        runner = asyncio.create_task(engine.run())
        await asyncio.sleep(0)
        handles = [engine.submit(prompt_tokens=32, max_tokens=max_tokens, ignore_eos=True) for _ in range(requests)]
        times: list[float] = []
        while len(times) < max_tokens:
            if isinstance(await handles[0].events.get(), Token):
                times.append(clock.now())
        await engine.wait_idle()
        engine.stop()
        await runner
        return [b - a for a, b in itertools.pairwise(times)]

    gaps = asyncio.run(go())
    total = registry.get_sample_value("vllm:inter_token_latency_seconds_sum", LABELS) or 0.0
    count = registry.get_sample_value("vllm:inter_token_latency_seconds_count", LABELS) or 0.0
    return Run(token_gaps=gaps, itl_mean=total / count if count else 0.0, itl_count=count)


def test_tensor_parallel_custom_all_reduce_pays_the_fault_every_step() -> None:
    slow = _run(tp=2, disable_custom_all_reduce=False)
    nccl = _run(tp=2, disable_custom_all_reduce=True)
    decode_step = TINY_CPU.step_seconds(4, 0)
    assert nccl.token_gaps == pytest.approx([decode_step] * 9)
    assert slow.token_gaps == pytest.approx([decode_step + 0.150] * 9)
    # The ITL the engine's /metrics report rises by the fault's 150 ms, over the same tokens.
    assert slow.itl_count == nccl.itl_count == 4 * 9
    assert slow.itl_mean - nccl.itl_mean == pytest.approx(0.150, abs=0.002)


def test_one_gpu_or_no_fault_costs_nothing() -> None:
    baseline = _run(tp=1, disable_custom_all_reduce=False, faults=FaultConfig())
    assert _run(tp=1, disable_custom_all_reduce=False).token_gaps == pytest.approx(baseline.token_gaps)
    assert _run(tp=2, disable_custom_all_reduce=False, faults=FaultConfig()).itl_mean == pytest.approx(
        baseline.itl_mean)
    assert baseline.itl_mean < 0.01


def test_penalty_rule() -> None:
    assert all_reduce_penalty_seconds(SLOW, tensor_parallel_size=4, custom_all_reduce=True) == 0.15
    assert all_reduce_penalty_seconds(SLOW, tensor_parallel_size=4, custom_all_reduce=False) == 0.0
    assert all_reduce_penalty_seconds(SLOW, tensor_parallel_size=1, custom_all_reduce=True) == 0.0
    assert all_reduce_penalty_seconds(FaultConfig(), tensor_parallel_size=2, custom_all_reduce=True) == 0.0


def test_flags_and_environment_configure_it() -> None:
    config, ignored = serve_config(["m", "-tp", "2", "--fault-slow-all-reduce-ms", "80"], {})
    assert ignored == [] and config.tensor_parallel_size == 2 and not config.disable_custom_all_reduce
    assert config.faults.slow_all_reduce_ms == 80.0
    config, _ = serve_config(["m", "--tensor-parallel-size=4", "--disable-custom-all-reduce"],
                             {"PITSTOP_SIM_FAULT_SLOW_ALL_REDUCE_MS": "120"})
    assert config.tensor_parallel_size == 4 and config.disable_custom_all_reduce
    assert config.faults.slow_all_reduce_ms == 120.0
    assert serve_config(["m"], {})[0].tensor_parallel_size == 1


@pytest.mark.parametrize("argv", [["m", "-tp", "0"], ["m", "--fault-slow-all-reduce-ms", "-5"]])
def test_bad_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        serve_config(argv, {})
