"""Is the engine making progress? The agent's own verdict, from evidence a wedged engine cannot fake.

A wedged vLLM answers ``/health`` 200 (vLLM #39863, #17972, #43423) and keeps answering ``/metrics``, but its
EngineCore publishes nothing: ``num_requests_running`` and ``num_requests_waiting`` read 0 (or their last
values) while clients' requests hang (vLLM PR #46811). Gauges can lie; two things cannot:

- a canary completion, which either finishes within its deadline or does not, and
- the engine's generated-tokens counter (its adapter's ``generation_tokens``: vLLM's
  ``vllm:generation_tokens_total``, SGLang's realtime decode tokens), read just before and just after each canary:
  a frozen core adds nothing.

The table (``docs/design.md``, "Progress"):

    canary          generation tokens during it   verdict
    completed       (any)                         SERVING
    failed / late   moved, or a token streamed    BUSY     a slow engine under load: never restarted
    failed / late   flat, or /metrics unreadable  SUSPECT  the first such canary
    failed / late   flat, or unreadable, N in a row  WEDGED  readiness off until a restart proves progress

The canary's own tokens count: a canary that streamed a token moved the counter, so an idle engine that
answers is never flat. Pure: the caller measures and passes the evidence in; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from agent.wire import EngineSample


class Progress(StrEnum):
    SERVING = "serving"
    BUSY = "busy"
    SUSPECT = "suspect"
    WEDGED = "wedged"


@dataclass(frozen=True)
class CanaryEvidence:
    """One canary's outcome and the engine's generation-token counter read around it (None: unreadable)."""

    ok: bool
    tokens_before: float | None = None
    tokens_after: float | None = None
    error: str | None = None
    # A late canary that streamed a token: its own token is progress, whatever the counter read.
    streamed: bool = False
    # The API server answered nothing, not even the /metrics read begun with the first canary: not read again.
    silent: bool = False

    @property
    def tokens_moved(self) -> bool | None:
        if self.streamed:
            return True
        if self.tokens_before is None or self.tokens_after is None:
            return None
        # A counter that went down is a new engine process: that is progress of a kind, not a wedge.
        return self.tokens_after != self.tokens_before


def judge(evidence: CanaryEvidence, streak: int, needed: int) -> Progress:
    """The verdict after one canary, given how many flat failures came right before it (``streak``)."""
    if evidence.ok:
        return Progress.SERVING
    if evidence.tokens_moved:
        return Progress.BUSY
    return Progress.WEDGED if streak + 1 >= needed else Progress.SUSPECT


@dataclass
class ProgressWatch:
    """The run of flat canary failures of one engine process; ``reset`` when a new process starts."""

    needed: int = 2
    streak: int = 0
    last: Progress | None = None
    # What the engine last published while it was visibly progressing: the requests a wedge takes with it.
    in_flight_when_live: float | None = None
    _history: list[CanaryEvidence] = field(default_factory=list)
    _previous_in_flight: float | None = None  # the last scrape's count, whatever it showed

    def observe(self, evidence: CanaryEvidence) -> Progress:
        verdict = judge(evidence, self.streak, self.needed)
        self.streak = self.streak + 1 if verdict in (Progress.SUSPECT, Progress.WEDGED) else 0
        self.last = verdict
        self._history = [*self._history[-(self.needed - 1):], evidence] if self.needed > 1 else [evidence]
        return verdict

    def round_ended(self) -> None:
        """A round of back-to-back canaries ended short of a verdict: its flat ones do not carry into the next
        round, a scrape interval later, since tokens may have moved in between, where no canary looked."""
        if self.last is not Progress.WEDGED:
            self.streak = 0

    def engine_seen(self, in_flight: float | None, tokens_moving: bool) -> None:
        """Remember the engine's in-flight count from a scrape that showed tokens moving.

        Tokens moving is the window since the previous scrape; the gauges are read at this one, which may come
        after the freeze (a frozen core's gauges read 0). So the previous scrape's count, taken while the
        engine still had tokens to make, counts too."""
        if tokens_moving and in_flight is not None:
            self.in_flight_when_live = max(in_flight, self._previous_in_flight or 0.0)
        self._previous_in_flight = in_flight

    def engine_scraped(self, engine: EngineSample) -> None:
        """``engine_seen`` from one scrape of the engine's /metrics (a failed scrape says nothing)."""
        if engine.scrape_error is None:
            busy = (engine.requests_running or 0.0) + (engine.requests_waiting or 0.0)
            self.engine_seen(busy, (engine.generation_tokens_per_second or 0.0) > 0)

    def reset(self) -> None:
        self.streak = 0
        self.last = None
        self.in_flight_when_live = None
        self._history = []
        self._previous_in_flight = None

    def wedged_reason(self, in_flight: int, connections: int | None) -> str:
        """The WEDGED transition's message: the verdict's evidence, and the requests the wedge holds."""
        return (f"wedged: {self.streak} canaries in a row failed with no generation token moving ({self.summary()}); "
                f"readiness off; {in_flight} request(s) in flight "
                f"({'unknown' if connections is None else connections} client connection(s) open)")

    def summary(self) -> str:
        """Why the last verdict was reached, for the transition's event message."""
        parts = []
        for e in self._history:
            tokens = (f"generation tokens {e.tokens_before:g} -> {e.tokens_after:g}"
                      if e.tokens_before is not None and e.tokens_after is not None else
                      "/metrics unanswered since the first canary" if e.silent else "/metrics unreadable")
            parts.append(f"{e.error or 'failed'} ({tokens})")
        return "; ".join(parts)
