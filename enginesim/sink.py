"""What the engine tells its metrics: one narrow protocol, so each engine personality counts in its own way.

The engine decides *when* something happened (and whether a frozen core may still publish); a sink decides what
that moves. vLLM's sink (``metrics.EngineMetrics``) counts tokens as they are produced and requests by finish
reason; SGLang's (``sglang_metrics``) counts a request's tokens when it finishes, labels streaming apart and
publishes its scheduler gauges on its own cadence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from enginesim.engine import RequestHandle
    from enginesim.scheduler import Sequence, StepPlan


class MetricsSink(Protocol):
    """The events of one engine (one scheduler) that its metrics hear about."""

    # Set once the core hangs: the engine then stops reporting what the core would have published.
    frozen: bool

    def freeze(self, *, zero_scheduler_gauges: bool) -> None:
        """The core hung: publish nothing more (zeroing the scheduler gauges first if asked)."""

    def request_submitted(self, handle: RequestHandle) -> None:
        """A request was queued."""

    def prefix_queried(self, prompt_tokens: int) -> None:
        """The prefix cache was asked about a prompt."""

    def prefix_hit(self, cached_tokens: int) -> None:
        """The prefix cache held this many of a prompt's tokens."""

    def step_scheduled(self, plan: StepPlan) -> None:
        """A step was planned (before it runs)."""

    def step_ran(self, plan: StepPlan, seconds: float) -> None:
        """A step's batch ran for ``seconds`` of (simulated) device time."""

    def prefill_done(self, seq: Sequence) -> None:
        """A sequence's whole prompt is in the cache."""

    def token_emitted(self, handle: RequestHandle, gap: float | None) -> None:
        """A request got a token; ``gap`` is the time since its previous one (None for its first)."""

    def first_token_sent(self, handle: RequestHandle, ttft: float) -> None:
        """A request's first token reached its client's connection, ``ttft`` seconds after it arrived."""

    def request_finished(self, handle: RequestHandle, reason: str, now: float) -> None:
        """A request ended: ``stop``, ``length`` or ``abort`` (its client went away)."""

    def request_failed(self, handle: RequestHandle, reason: str) -> None:
        """The engine failed a request in flight (``error`` when it died, ``abort`` when it was stopped)."""

    def request_aborted(self, handle: RequestHandle) -> None:
        """A request's client went away, whether or not the core can still report it."""

    def error_answered(self) -> None:
        """The API answered a request with an error before it reached the engine (the error-rate fault)."""

    def set_scheduler_state(self, *, running: int, waiting: int, waiting_for_capacity: int, kv_usage: float,
                            step: StepPlan | None = None) -> None:
        """The scheduler's state after an event; ``step`` is the step just completed, if that was the event."""
