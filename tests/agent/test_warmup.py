"""Warmup ends when TTFT settles (bounded by a count), checked on the rule and on the simulator's cold start."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from agent.config import BackoffConfig, ReplicaConfig, WarmupConfig
from agent.supervisor import ReplicaSupervisor
from agent.warmup import settled, warmup_done, warmup_summary
from agent.wire import ReplicaState
from tests.helpers import free_port

COLD = [0.030, 0.022, 0.014, 0.0101, 0.0100, 0.0102]  # the shape of a cold start fading out


def test_not_done_before_the_minimum_even_if_flat() -> None:
    warmup = WarmupConfig(requests=4, settle_count=2)
    assert not warmup_done([0.01, 0.01, 0.01], warmup)
    assert warmup_done([0.01, 0.01, 0.01, 0.01], warmup)


def test_done_only_once_the_last_ttfts_agree() -> None:
    warmup = WarmupConfig(requests=2, settle_count=3, settle_tolerance=0.1, settle_floor_seconds=0.0)
    done_at = next(n for n in range(1, len(COLD) + 1) if warmup_done(COLD[:n], warmup))
    assert done_at == 6  # [0.014, 0.0101, 0.0100] still spreads 40 %; the 6th request closes a flat window


def test_settled_is_relative_with_an_absolute_floor() -> None:
    assert settled([0.0100, 0.0105, 0.0102], 0.1, 0.0)
    assert not settled([0.014, 0.0101, 0.0100], 0.1, 0.0)
    assert settled([0.0010, 0.0020, 0.0015], 0.1, 0.003)  # sub-millisecond noise is not a cold engine
    assert not settled([], 0.1, 1.0)


def test_bounded_by_max_requests_and_fixed_count_without_settling() -> None:
    never = WarmupConfig(requests=1, max_requests=5, settle_count=3, settle_tolerance=0.0, settle_floor_seconds=0)
    assert not warmup_done([0.1, 0.2, 0.3, 0.4], never)
    assert warmup_done([0.1, 0.2, 0.3, 0.4, 0.5], never)
    assert "not settled after 5" in warmup_summary([0.1, 0.2, 0.3, 0.4, 0.5], never)
    fixed = WarmupConfig(requests=2, settle_count=0)
    assert warmup_done([0.5, 0.01], fixed)
    assert warmup_done([], WarmupConfig(requests=0))


def test_max_requests_below_requests_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="max_requests"):
        WarmupConfig(requests=5, max_requests=2)


@pytest.mark.slow
def test_simulator_cold_start_needs_more_warmup_than_a_fixed_count(tmp_path: Path) -> None:
    # llama-8b-h100 runs its first 100 steps up to 3x slower; 40-token requests walk through that fade. A
    # 3,000-token prompt (not cached: every request prefills it) makes the first token ~85 ms warm and ~250 ms
    # cold, so the fade stands well above the tens of ms of HTTP and scheduling a busy host adds to each TTFT.
    warmup = WarmupConfig(requests=2, max_requests=15, settle_count=3, settle_tolerance=0.25,
                          settle_floor_seconds=0.002, max_tokens=40, prompt="warm " * 2400)
    spec = ReplicaConfig(name="w", model="tiny", port=free_port(), warmup=warmup, start_timeout=30,
                         stop_timeout=5, args=["--sim-startup-seconds", "0.2", "--no-enable-prefix-caching"],
                         env={"PITSTOP_SIM_GPU_DIR": str(tmp_path / "simgpu")})

    async def scenario() -> tuple[list[float], str]:
        async with httpx.AsyncClient() as client:
            sup = ReplicaSupervisor(spec, client, tmp_path / "state", BackoffConfig(), poll_interval=0.1)
            task = asyncio.create_task(sup.run())
            try:
                for _ in range(300):
                    if sup.state == ReplicaState.READY:
                        break
                    await asyncio.sleep(0.1)
                ready = [e for e in sup.machine.drain_events() if e.to_state == ReplicaState.READY]
            finally:
                sup.request_shutdown()
                await asyncio.wait_for(task, 30)
            return sup.warmup_ttfts, ready[0].message if ready else "never READY"

    ttfts, message = asyncio.run(scenario())
    assert len(ttfts) > warmup.requests, message  # a fixed count of 2 would have let a cold engine serve
    assert len(ttfts) < warmup.max_requests, message  # ... and it did settle
    assert ttfts[0] > 1.5 * min(ttfts[-3:]), message  # the cold start was real and is over
    assert re.search(rf"TTFT settled after {len(ttfts)} warmup requests", message)
