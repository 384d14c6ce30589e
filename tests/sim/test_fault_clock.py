"""The shared fault clock: engines that replace a faulty one are spared its hang, not the GPU's heat or the
traffic's surge; and the latency surge makes steps slower per sequence in the batch."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from enginesim.faults import FaultConfig, fault_delay, resolve_faults
from tests.helpers import wait_until
from tests.sim.conftest import StartSim
from tests.sim.streams import stream_chat


def test_a_process_started_after_the_hang_moment_never_hangs() -> None:
    assert fault_delay("hang_after", 20, clock=1000, listening_at=990, now=990) == 30
    assert fault_delay("hang_after", 20, clock=1000, listening_at=1030, now=1030) is None
    assert fault_delay("leak_after", 0, clock=1000, listening_at=1030, now=1030) is None


def test_a_hot_gpu_or_a_surge_already_under_way_holds_for_a_replacement() -> None:
    assert fault_delay("hot_gpu_after", 20, clock=1000, listening_at=1030, now=1030) == 0
    assert fault_delay("latency_surge_after", 20, clock=1000, listening_at=1030, now=1030) == 0


def test_the_clock_file_path_is_read_from_the_environment_as_written() -> None:
    faults = resolve_faults({}, {"PITSTOP_SIM_FAULT_CLOCK_FILE": "/State/Fault-Clock",
                                 "PITSTOP_SIM_FAULT_LATENCY_SURGE_AFTER": "5"})
    assert faults == FaultConfig(clock_file="/State/Fault-Clock", latency_surge_after=5.0)


def _itl(url: str) -> float:
    """The median gap between tokens of one streamed answer (one sequence in the batch)."""
    times = stream_chat(url, max_tokens=16).token_times
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return gaps[len(gaps) // 2]


@pytest.mark.slow
def test_latency_surge_waits_for_the_clock_file_then_slows_every_step(start_sim: StartSim, tmp_path: Path) -> None:
    clock = tmp_path / "fault-clock"
    sim = start_sim("--fault-clock-file", str(clock), "--fault-latency-surge-after", "0",
                    "--fault-latency-surge-ms-per-seq", "40")
    before = _itl(sim.url)
    assert before < 0.03, before  # no clock yet: no surge
    clock.write_text(f"{time.time():.3f}")
    wait_until(lambda: "injected fault: latency surge" in sim.output(), 10, what="the surge")
    assert _itl(sim.url) > before + 0.03
