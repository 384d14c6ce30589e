"""How the governor benchmark reads the agent: the SLO as the itl-slo policy reads it, throughput across restarts."""

from __future__ import annotations

from bench.harness.replica_watch import Reading, Tick, breach_share, last_restart, slo_met, throughput

NAMES = ["a", "b"]


def tick(t: float, itl: float | None, tokens: float, *, state: str = "READY", generation: int = 1,
         b_itl: float | None = None) -> Tick:
    return Tick(t, {"a": Reading(state, 48, itl, tokens, generation),
                    "b": Reading("READY", 48, itl if b_itl is None else b_itl, tokens, 1)})


def test_the_slo_is_met_once_a_whole_window_has_few_enough_readings_over_it():
    # A burst in one reading of ten is under the 20 % share; two in a row of five are not.
    ticks = [tick(t, 0.3 if t in (3, 4) else 0.05, 100.0 * t) for t in range(0, 30)]
    first, for_good = slo_met(ticks, NAMES, 0.2, window=10, share=0.2)
    assert first == 13 and for_good == 13  # (3, 13]: one burst in ten readings
    assert breach_share(ticks, NAMES, 0.2, since=0) == 2 / 30


def test_a_replica_out_of_ready_or_breaching_later_resets_for_good():
    ticks = [tick(t, 0.05, 100.0 * t, state="STARTING" if t == 12 else "READY",
                  b_itl=0.5 if 20 <= t <= 22 else None) for t in range(0, 40)]
    first, for_good = slo_met(ticks, NAMES, 0.2, window=5, share=0.2)
    assert first == 5
    assert for_good == 27  # (22, 27]: b's three readings over 0.2 (t=20-22) have left the 5-s window


def test_throughput_counts_a_restarted_engine_from_zero():
    # a restarts at t=10 (its counter drops to 0), b keeps counting; both make 100 tokens/s throughout.
    ticks = [Tick(t, {"a": Reading("READY", 48, 0.05, 100.0 * (t if t < 10 else t - 10), 1 if t < 10 else 2),
                      "b": Reading("READY", 48, 0.05, 100.0 * t, 1)}) for t in range(0, 21)]
    assert throughput(ticks, NAMES, since=0) == 195.0  # the restart tick loses one second of a's tokens
    assert throughput(ticks, NAMES, since=11) == 200.0
    assert last_restart(ticks, NAMES) == 10
