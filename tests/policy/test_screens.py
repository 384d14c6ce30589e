"""A screen never hides a finding: where it says a subject is calm, the condition's detector finds nothing, and
no breach is under way (``due``).

Subjects are generated around every boundary a screen reads (each state, a last exit or none, readings just
under, at and over the threshold or the GPU's limit, missing readings, throttle reasons, samples stamped after
the round's clock), and judged by the shipped conditions and by variants of them (other operators, shares).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.wire import ReplicaState
from controlplane.policy.conditions import (
    Condition,
    CrashLoopCondition,
    EccCondition,
    ErrorRateCondition,
    LeakCondition,
    OomCrashCondition,
    StallCondition,
    ThermalCondition,
    ThresholdCondition,
    XidCondition,
)
from controlplane.policy.detectors.slo import threshold_due
from controlplane.policy.detectors.thermal import thermal_due
from controlplane.policy.evaluate import GPU_CONDITIONS, detect_gpu, detect_replica
from controlplane.policy.policy import Policy
from controlplane.policy.screens import screen
from controlplane.policy.snapshot import FleetSnapshot, Gpu, GpuReading, Node, Replica, ReplicaSample
from controlplane.policy_files import DEFAULTS_DIR, load_directory
from tests.policy.series import GiB, at, gpu, replica

NOW = at(600.0)

VARIANTS: list[Condition] = [
    ThresholdCondition(signal="ttft_p99_seconds", op=">", threshold=0.5, **{"for": 20}),
    ThresholdCondition(signal="ttft_p99_seconds", op=">=", threshold=0.5, **{"for": 20}),
    ThresholdCondition(signal="kv_cache_usage_ratio", op="<", threshold=0.5, **{"for": 20}),
    ThresholdCondition(signal="kv_cache_usage_ratio", op="<=", threshold=0.5, **{"for": 20}),
    ThresholdCondition(signal="ttft_p99_seconds", op=">", threshold=0.5, min_share=0.5, **{"for": 20}),
    ThermalCondition(detector="thermal", margin_celsius=0, **{"for": 20}),
    ThermalCondition(detector="thermal", margin_celsius=5, **{"for": 20}),
    XidCondition(detector="xid", blast_radius="any", within=60),
    EccCondition(detector="ecc", within=60),
    StallCondition(detector="stall", require_canary_failure=False, **{"for": 20}),
    ErrorRateCondition(detector="error_rate", threshold=0.01, min_requests_per_second=0.1, **{"for": 20}),
    LeakCondition(detector="leak", resource="rss", min_window=60, min_samples=5, lookback=600, horizon=24 * 3600,
                  min_slope_bytes_per_minute=1024, limit_bytes=64 * GiB),
    CrashLoopCondition(detector="crash_loop"),
    OomCrashCondition(detector="oom_crash"),
]


def _conditions() -> list[Condition]:
    shipped: list[Policy] = load_directory(DEFAULTS_DIR)
    return [p.condition for p in shipped] + VARIANTS


CONDITIONS = _conditions()
near = st.sampled_from([None, 0.0, 0.25, 0.49, 0.5, 0.51, 0.9, 2.0])
times = st.lists(st.sampled_from([5.0, 10.0, 10.0, 10.0, 40.0]), min_size=0, max_size=30)


def _mostly(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> Callable[[], Any]:
    """A subject's reading of one field: mostly its own steady value (a breach holds for a window only where the
    readings agree), now and then another."""
    steady = draw(values)
    return lambda: steady if draw(st.integers(0, 5)) else draw(values)


@st.composite
def replicas(draw: st.DrawFn) -> Replica:
    ttft, kv, itl, waiting, canary, errors, rate = (
        _mostly(draw, near), _mostly(draw, near), _mostly(draw, near), _mostly(draw, st.sampled_from([None, 0.0, 3.0])),
        _mostly(draw, st.sampled_from([None, True, False])), _mostly(draw, st.sampled_from([None, 0.0, 1.0])),
        _mostly(draw, st.sampled_from([None, 0.0, 5.0])))
    steps = draw(times)
    t = 600.0 - sum(steps) + draw(st.sampled_from([0.0, 0.0, 3.0]))  # sometimes the newest is after the clock
    history = []
    tokens = 1000.0
    for step in [0.0, *steps]:
        t += step
        tokens += draw(st.sampled_from([0.0, 0.0, 500.0]))
        history.append(ReplicaSample(
            at=at(t), ttft_p99_seconds=ttft(), kv_cache_usage_ratio=kv(), itl_p99_seconds=itl(),
            requests_waiting=waiting(), requests_running=3.0, generation_tokens_total=tokens, canary_ok=canary(),
            errors_per_second=errors(), requests_per_second=rate(),
            rss_bytes=int(20 * GiB + draw(st.sampled_from([0, 1, 2])) * t * 2**20)))
    return replica(state=draw(st.sampled_from(list(ReplicaState))), history=history[:-1] if not steps else history,
                   last_exit_code=draw(st.sampled_from([None, 0, 1, 137])),
                   log_tail=draw(st.sampled_from([[], ["torch.OutOfMemoryError: CUDA out of memory"]])),
                   state_since=at(draw(st.sampled_from([0.0, 590.0]))), restarts_total=2)


@st.composite
def gpus(draw: st.DrawFn) -> Gpu:
    heat = _mostly(draw, st.sampled_from([None, 70.0, 83.9, 84.0, 88.0, 89.0, 95.0]))
    throttled = _mostly(draw, st.sampled_from([(), ("hw_thermal_slowdown",), ("sw_power_cap",)]))
    steps = draw(times)
    t = 600.0 - sum(steps) + draw(st.sampled_from([0.0, 0.0, 3.0]))
    reads_ecc = draw(st.booleans())
    readings = []
    total = errors = 0
    for step in [0.0, *steps]:
        t += step
        total += draw(st.sampled_from([0, 0, 0, 1]))
        errors = draw(st.sampled_from([errors, errors, errors, errors + 1, 0]))  # rises, and resets
        readings.append(GpuReading(
            at=at(t), temperature_celsius=heat(), xid_events_total=total, xids=(79,) if total else (),
            throttle_reasons=throttled(), ecc_uncorrected_total=errors if reads_ecc else None))
    latest = draw(st.sampled_from([0, total]))
    return gpu(history=readings, slowdown_temperature_celsius=draw(st.sampled_from([None, 89.0])),
               xid_events_total=latest, last_xid=79 if latest else None)


def _snapshot(r: Replica) -> FleetSnapshot:
    return FleetSnapshot(now=NOW, nodes=[Node(name=r.node, memory_total_bytes=64 * GiB)], replicas=[r],
                         gpus=[gpu(memory_total_bytes=141 * GiB)])


@pytest.mark.parametrize("cond", [c for c in CONDITIONS if not isinstance(c, GPU_CONDITIONS)], ids=repr)
def test_a_screened_replica_has_no_finding(cond: Condition) -> None:
    calm = screen(cond, NOW)

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(replicas())
    def check(r: Replica) -> None:
        if calm is not None and calm(r):
            assert detect_replica(cond, r, _snapshot(r), NOW) is None
            if isinstance(cond, ThresholdCondition) and r.serving:  # nor is a breach under way (``due``)
                assert threshold_due(cond, r, NOW) is None

    check()


@pytest.mark.parametrize("cond", [c for c in CONDITIONS if isinstance(c, GPU_CONDITIONS)], ids=repr)
def test_a_screened_gpu_has_no_finding(cond: Condition) -> None:
    calm = screen(cond, NOW)

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(gpus())
    def check(g: Gpu) -> None:
        if calm is not None and calm(g):
            assert detect_gpu(cond, g, NOW) is None
            if isinstance(cond, ThermalCondition):
                assert thermal_due(cond, g, NOW) is None

    check()


def test_screens_pass_the_common_case_and_hold_back_the_rest() -> None:
    """A healthy subject is screened by every screen; one breaching now is not (or the screens save nothing, or
    hide what they must not)."""
    calm_history = [ReplicaSample(at=NOW - timedelta(seconds=5 * i), ttft_p99_seconds=0.1) for i in range(10, -1, -1)]
    hot_history = [ReplicaSample(at=s.at, ttft_p99_seconds=0.9) for s in calm_history]
    ttft = ThresholdCondition(signal="ttft_p99_seconds", op=">", threshold=0.5, **{"for": 20})
    check = screen(ttft, NOW)
    assert check is not None
    assert check(replica(history=calm_history)) and not check(replica(history=hot_history))
    assert check(replica(history=hot_history, state=ReplicaState.BACKOFF))  # not serving: never judged
    # The newest reading is stamped after the round's clock (a skewed agent): the one before it is the newest now.
    ahead = [*hot_history, ReplicaSample(at=NOW + timedelta(seconds=3), ttft_p99_seconds=0.1)]
    assert detect_replica(ttft, replica(history=ahead), _snapshot(replica(history=ahead)), NOW) is not None
    assert not check(replica(history=ahead))
    crash = screen(CrashLoopCondition(detector="crash_loop"), NOW)
    assert crash is not None and crash(replica()) and not crash(replica(state=ReplicaState.FATAL))
    cool = [GpuReading(at=s.at, temperature_celsius=60.0) for s in calm_history]
    heat = screen(ThermalCondition(detector="thermal", **{"for": 20}), NOW)
    assert heat is not None
    assert heat(gpu(history=cool, slowdown_temperature_celsius=89.0))
    assert not heat(gpu(history=[GpuReading(at=NOW, temperature_celsius=88.0)], slowdown_temperature_celsius=89.0))
