"""The agent's progress verdict: which canary outcomes and token counts mean serving, busy, suspect or wedged."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agent.probes import stream_completion
from agent.progress import CanaryEvidence, Progress, ProgressWatch, judge

OK = CanaryEvidence(ok=True)
FLAT = CanaryEvidence(ok=False, tokens_before=100.0, tokens_after=100.0, error="no completion within 3s")
MOVED = CanaryEvidence(ok=False, tokens_before=100.0, tokens_after=160.0, error="no completion within 3s")
UNREADABLE = CanaryEvidence(ok=False, tokens_before=100.0, tokens_after=None, error="ReadTimeout")


@pytest.mark.parametrize(("evidence", "streak", "needed", "verdict"), [
    (OK, 0, 2, Progress.SERVING),
    (OK, 5, 2, Progress.SERVING),            # a completed canary clears any suspicion
    (MOVED, 0, 2, Progress.BUSY),            # late while tokens flow: a busy engine, never restarted
    (MOVED, 1, 2, Progress.BUSY),
    (FLAT, 0, 2, Progress.SUSPECT),          # one flat failure is not yet a wedge
    (FLAT, 1, 2, Progress.WEDGED),           # two in a row are
    (FLAT, 0, 1, Progress.WEDGED),
    (UNREADABLE, 1, 2, Progress.WEDGED),     # no /metrics and no completion: no evidence of progress at all
    (CanaryEvidence(ok=False, tokens_before=200.0, tokens_after=3.0), 1, 2, Progress.BUSY),  # a new process
    (CanaryEvidence(ok=False, tokens_before=9.0, tokens_after=9.0, streamed=True), 1, 2, Progress.BUSY),  # its token
    (CanaryEvidence(ok=False, silent=True), 1, 2, Progress.WEDGED),  # the API server answered nothing
])
def test_verdicts(evidence: CanaryEvidence, streak: int, needed: int, verdict: Progress) -> None:
    assert judge(evidence, streak, needed) is verdict


def test_the_streak_needs_failures_in_a_row() -> None:
    watch = ProgressWatch(needed=2)
    assert [watch.observe(e) for e in (FLAT, OK, FLAT, MOVED, FLAT, FLAT)] == [
        Progress.SUSPECT, Progress.SERVING, Progress.SUSPECT, Progress.BUSY, Progress.SUSPECT, Progress.WEDGED]
    assert "generation tokens 100 -> 100" in watch.summary()
    watch.reset()
    assert (watch.streak, watch.last) == (0, None)
    assert watch.observe(FLAT) is Progress.SUSPECT


def test_a_rounds_flat_canaries_do_not_carry_into_the_next_round() -> None:
    # A round: the first canary late while tokens moved, the confirming one flat. The next round comes a scrape
    # interval later, and tokens may have moved in between: its first flat canary starts a streak of its own.
    watch = ProgressWatch(needed=2)
    assert [watch.observe(e) for e in (MOVED, FLAT)] == [Progress.BUSY, Progress.SUSPECT]
    watch.round_ended()
    assert watch.observe(FLAT) is Progress.SUSPECT
    assert watch.observe(FLAT) is Progress.WEDGED
    watch.round_ended()  # a verdict stands
    assert watch.streak == 2 and watch.last is Progress.WEDGED


def test_in_flight_is_remembered_only_while_tokens_move() -> None:
    watch = ProgressWatch()
    watch.engine_seen(3.0, tokens_moving=True)
    watch.engine_seen(0.0, tokens_moving=False)  # a frozen core's gauges read 0: not the count that is lost
    assert watch.in_flight_when_live == 3.0



def test_the_scrape_that_saw_the_last_tokens_but_read_its_gauges_after_the_freeze_does_not_zero_the_count() -> None:
    watch = ProgressWatch()
    watch.engine_seen(4.0, tokens_moving=True)
    watch.engine_seen(0.0, tokens_moving=True)  # tokens came before the freeze; the gauges were read after it
    watch.engine_seen(0.0, tokens_moving=False)
    assert watch.in_flight_when_live == 4.0
    watch.reset()
    watch.engine_seen(0.0, tokens_moving=True)  # a new process: the old one's count is not carried over
    assert watch.in_flight_when_live == 0.0

def test_the_wedged_message_gives_the_evidence_and_what_the_wedge_holds() -> None:
    watch = ProgressWatch(needed=2)
    watch.observe(CanaryEvidence(ok=False, tokens_before=40, tokens_after=40, error="timed out"))
    watch.observe(CanaryEvidence(ok=False, error="timed out"))
    assert watch.wedged_reason(3, None) == (
        "wedged: 2 canaries in a row failed with no generation token moving (timed out (generation tokens 40 -> 40); "
        "timed out (/metrics unreadable)); readiness off; 3 request(s) in flight (unknown client connection(s) open)")
    assert watch.wedged_reason(2, 2).endswith("2 request(s) in flight (2 client connection(s) open)")


def test_a_canary_that_is_accepted_and_never_answered_fails_at_its_deadline() -> None:
    # A wedged vLLM takes the request and sends nothing more (vLLM #39863): the deadline covers the whole
    # request, not only each read.
    class Silent(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            yield b": accepted\n\n"
            await asyncio.sleep(3600)

        async def aclose(self) -> None:
            return None

    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Silent(), headers={"content-type": "text/event-stream"})

    async def run() -> tuple[bool, str | None, float, bool]:
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            started = loop.time()
            result = await stream_completion(client, "http://engine", "m", "ping", 4, 0.2, loop.time)
            return result.ok, result.error, loop.time() - started, result.cut

    ok, error, took, cut = asyncio.run(run())
    assert not ok and error == "no completion within 0.2s"
    assert took < 5  # bounded by the deadline, not by the engine
    assert cut  # the agent hung up on it: the engine counts an abort that is the agent's, not a user's


def test_a_canary_the_engine_refuses_is_not_one_the_agent_cut() -> None:
    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="overloaded")

    async def run() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            result = await stream_completion(client, "http://engine", "m", "ping", 4, 5.0, loop.time)
            return result.ok, result.cut

    assert asyncio.run(run()) == (False, False)
