"""The simulated EngineCore: one asyncio task that runs scheduler steps and streams tokens to requests.

Each step takes the profile's time for its shape (``SpeedProfile.step_seconds``) plus a fixed overhead (an
injected slow all-reduce), then every sequence in the batch whose prefill is complete gets one token. Timings
recorded per request follow vLLM's definitions: queue = arrival to first scheduled, prefill = first scheduled
to first token, decode = first to last token. TTFT is observed by whoever hands the first token to the
client's connection (``RequestHandle.first_token_sent``) so the histogram equals what a streaming client
measures; as in vLLM, a request whose first token is also its last is counted too.
"""

from __future__ import annotations

import asyncio
import enum
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field

from enginesim.clock import Clock
from enginesim.faults import HangGauges
from enginesim.profiles import SpeedProfile
from enginesim.scheduler import KvCacheExhausted, Scheduler, Sequence, StepPlan
from enginesim.sink import MetricsSink

PREFIX_CACHE_ENTRIES = 4096


class EngineState(enum.StrEnum):
    RUNNING = "running"
    HUNG = "hung"  # the loop stopped stepping and publishes nothing; requests queue unanswered (vllm#39863)
    DEAD = "dead"  # crashed: in-flight requests failed, /health turns 503
    STOPPED = "stopped"


class EngineDeadError(RuntimeError):
    """The engine cannot take requests any more."""


@dataclass(frozen=True)
class Token:
    index: int


@dataclass(frozen=True)
class Finished:
    reason: str  # stop | length | abort


@dataclass(frozen=True)
class Failed:
    message: str


StreamEvent = Token | Finished | Failed


@dataclass(eq=False)
class RequestHandle:
    """A submitted request: its scheduler sequence, its timestamps and the queue its tokens arrive on."""

    seq: Sequence
    max_tokens: int
    arrival: float
    metrics: MetricsSink
    events: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    ttft_observed: bool = False
    done: bool = False
    # How the client asked (SGLang labels streaming apart), and whether it is counted at all (SGLang's health
    # check generates a token without moving any metric).
    stream: bool = False
    log_metrics: bool = True

    def first_token_sent(self, now: float) -> None:
        """Record TTFT once, at the moment the first token reaches the client's connection."""
        if not self.ttft_observed:
            self.ttft_observed = True
            # A token queued just before a hang may still be written; a frozen core's histograms stay put.
            if not self.metrics.frozen:
                self.metrics.first_token_sent(self, now - self.arrival)


class Engine:
    """Continuous batching over a Scheduler, timed by a SpeedProfile, on an injected Clock."""

    def __init__(self, *, profile: SpeedProfile, scheduler: Scheduler, metrics: MetricsSink, clock: Clock,
                 prefix_caching: bool = True, seed: int = 0, step_overhead_s: float = 0.0) -> None:
        self.profile = profile
        # A fixed cost every step pays on top of the profile's (the slow all-reduce fault, ``faults.py``).
        self.step_overhead_s = step_overhead_s
        # A cost every step pays per sequence in its batch on top of the profile's (the latency-surge fault).
        self.step_overhead_per_seq_s = 0.0
        self.scheduler = scheduler
        self.metrics = metrics
        self.clock = clock
        self.prefix_caching = prefix_caching
        self.state = EngineState.RUNNING
        self.death_message = ""
        self.died = asyncio.Event()
        self.busy_seconds = 0.0
        # Step time weighted by how much of the GPU each step's batch fills (``SpeedProfile.utilization``): its
        # rise over an interval, divided by the interval, is the GPU's utilisation.
        self.load_seconds = 0.0
        self.completed = 0
        self.steps = 0
        self._rng = random.Random(seed)
        self._handles: dict[Sequence, RequestHandle] = {}
        self._prefix_cache: OrderedDict[int, None] = OrderedDict()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._stopped = asyncio.Event()
        self._ids = 0
        self._step_end = 0.0
        # When a step last gave any request a token (None: never); SGLang's health check waits for one.
        self.last_output: float | None = None

    @property
    def in_flight(self) -> int:
        return len(self._handles)

    def has_work(self) -> bool:
        """A request is running or queued."""
        return self.scheduler.has_work

    async def wait_idle(self) -> None:
        """Return once no request is in flight."""
        while self._handles:
            self._idle.clear()
            await self._idle.wait()

    def output_length(self, max_tokens: int, ignore_eos: bool) -> int:
        """``max_tokens`` when EOS is ignored, else a seeded answer length (exponential around the profile mean)."""
        if ignore_eos:
            return max_tokens
        natural = 1 + int(self._rng.expovariate(1.0 / self.profile.mean_output_tokens))
        return max(1, min(max_tokens, natural))

    def submit(self, *, prompt_tokens: int, max_tokens: int, ignore_eos: bool = False,
               prefixes: tuple[tuple[int, int], ...] = (), arrival: float | None = None, stream: bool = False,
               log_metrics: bool = True) -> RequestHandle:
        """Queue a request; its tokens arrive on the returned handle's ``events``."""
        if self.state is EngineState.DEAD or self.state is EngineState.STOPPED:
            raise EngineDeadError(self.death_message or "engine is not running")
        self._ids += 1
        cached = self._prefix_lookup(prefixes, prompt_tokens)
        seq = Sequence(request_id=f"req-{self._ids}", prompt_tokens=prompt_tokens,
                       output_tokens=self.output_length(max_tokens, ignore_eos), cached_tokens=cached)
        handle = RequestHandle(seq=seq, max_tokens=max_tokens,
                               arrival=self.clock.now() if arrival is None else arrival, metrics=self.metrics,
                               stream=stream, log_metrics=log_metrics)
        self._handles[seq] = handle
        self.scheduler.add(seq)
        # A hung engine still takes the request (vLLM's API server queues it for the frozen core) but counts
        # nothing: in vLLM these families come from the core's stats, which stopped (vllm#39863).
        if not self.metrics.frozen:
            self.metrics.request_submitted(handle)
        self._publish_gauges()
        self._wake.set()
        return handle

    def _prefix_lookup(self, prefixes: tuple[tuple[int, int], ...], prompt_tokens: int) -> int:
        """Prompt tokens already in the prefix cache (whole blocks), remembering this prompt's prefixes."""
        if not self.prefix_caching or not prefixes:
            return 0
        if not self.metrics.frozen:
            self.metrics.prefix_queried(prompt_tokens)
        matched = 0
        for key, tokens in prefixes:
            if key in self._prefix_cache:
                matched = tokens
                self._prefix_cache.move_to_end(key)
            else:
                self._prefix_cache[key] = None
        while len(self._prefix_cache) > PREFIX_CACHE_ENTRIES:
            self._prefix_cache.popitem(last=False)
        # Whole blocks only, and never the last prompt token: vLLM must compute it to sample.
        block = self.scheduler.block_size
        cached = min(matched, prompt_tokens - 1) // block * block
        if cached and not self.metrics.frozen:
            self.metrics.prefix_hit(cached)
        return cached

    def abort(self, handle: RequestHandle) -> None:
        """The client went away: free the request's KV and count it as aborted."""
        if handle.done:
            return
        self.scheduler.remove(handle.seq)
        self.metrics.request_aborted(handle)
        if self.metrics.frozen:
            # Hung: the request is forgotten here so nothing leaks, but a frozen core never reports the abort.
            handle.done = True
            self._handles.pop(handle.seq, None)
        else:
            self._finish(handle, "abort", self.clock.now(), deliver=False)
        self._publish_gauges()

    def hang(self, gauges: HangGauges = "zero") -> None:
        """Stop stepping and publishing for good while the API keeps answering (vllm#39863).

        ``gauges`` is what running/waiting read from then on: ``zero`` (vLLM 0.32 with its EngineCore frozen)
        or ``last``, the values at the hang. Either way no gauge, counter or histogram moves any more.
        """
        if self.state is EngineState.RUNNING:
            self.state = EngineState.HUNG
            self.metrics.freeze(zero_scheduler_gauges=gauges == "zero")

    def kill(self, message: str) -> None:
        """Die: fail every in-flight request, mark the engine dead so /health turns 503."""
        if self.state in (EngineState.DEAD, EngineState.STOPPED):
            return
        self.state = EngineState.DEAD
        self.death_message = message
        self._fail_all(message, "error")
        self.died.set()
        self._wake.set()

    def stop(self, message: str = "engine shut down") -> None:
        """Clean stop: in-flight requests are failed (aborted) and the loop ends."""
        if self.state is not EngineState.DEAD:
            self.state = EngineState.STOPPED
        self._fail_all(message, "abort")
        self._stopped.set()
        self._wake.set()

    def _fail_all(self, message: str, reason: str) -> None:
        for handle in list(self._handles.values()):
            self.scheduler.remove(handle.seq)
            handle.done = True
            if not self.metrics.frozen:
                self.metrics.request_failed(handle, reason)
            handle.events.put_nowait(Failed(message))
        self._handles.clear()
        self._publish_gauges()

    async def run(self) -> None:
        """The engine loop: one task, sleeping while idle, one clock sleep per step."""
        self._step_end = self.clock.now()
        while self.state is EngineState.RUNNING:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                self._step_end = self.clock.now()  # the GPU idled: nothing to absorb
                continue
            try:
                plan = self.scheduler.schedule()
            except KvCacheExhausted as exc:
                gib = exc.needed_blocks * self.scheduler.block_size * self.profile.kv_bytes_per_token / 2**30
                self.kill(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib:.2f} GiB "
                          f"for KV cache of {exc.request_id} ({exc.needed_blocks} blocks needed, "
                          f"{exc.total_blocks} in the cache).")
                return
            self._on_scheduled(plan)
            seconds = self.profile.step_seconds(len(plan.scheduled), plan.prefill_tokens)
            seconds *= self.profile.warmup_multiplier(self.steps)
            seconds += self.step_overhead_s + self.step_overhead_per_seq_s * len(plan.scheduled)
            self.steps += 1
            # The profile's step cost already includes vLLM's host overhead, so the simulator's own work
            # between steps (delivering tokens, HTTP) is absorbed into the next step rather than added to it:
            # a step starts where the previous one ended, unless the engine lags by more than a step (idle, or
            # a starved host), where it starts now.
            # A step never starts before the requests it admits arrived: one that came in while the previous
            # step ran waits for it, as on a GPU, so its TTFT holds at least one full step.
            now = self.clock.now()
            arrived = max((self._handles[seq].arrival for seq in plan.newly_admitted), default=self._step_end)
            step_end = max(self._step_end, now - seconds, arrived) + seconds
            self._step_end = step_end
            await self.clock.sleep(step_end - now)
            self.busy_seconds += seconds
            self.load_seconds += seconds * self.profile.utilization(len(plan.scheduled))
            if self.state is not EngineState.RUNNING:
                break
            self.metrics.step_ran(plan, seconds)
            self._on_step_done(plan)
        if self.state is EngineState.HUNG:
            await self._stopped.wait()

    def _on_scheduled(self, plan: StepPlan) -> None:
        now = self.clock.now()
        for seq in plan.newly_admitted:
            self._handles[seq].first_scheduled = now
        self.metrics.step_scheduled(plan)

    def _on_step_done(self, plan: StepPlan) -> None:
        outcome = self.scheduler.complete(plan)
        now = self.clock.now()
        m = self.metrics
        for seq in outcome.prefill_done:
            m.prefill_done(seq)
        if outcome.emitted:
            self.last_output = now
        for seq in outcome.emitted:
            handle = self._handles.get(seq)
            if handle is None:
                continue
            if handle.first_token is None:
                handle.first_token = now
                m.token_emitted(handle, None)
            else:
                assert handle.last_token is not None
                m.token_emitted(handle, now - handle.last_token)
            handle.last_token = now
            handle.events.put_nowait(Token(seq.generated - 1))
        for seq in outcome.finished:
            handle = self._handles.get(seq)
            if handle is not None:
                reason = "length" if seq.generated >= handle.max_tokens else "stop"
                self._finish(handle, reason, now, deliver=True)
        self._publish_gauges(plan)

    def _finish(self, handle: RequestHandle, reason: str, now: float, *, deliver: bool) -> None:
        handle.done = True
        self._handles.pop(handle.seq, None)
        self.completed += 1
        self.metrics.request_finished(handle, reason, now)
        if deliver:
            handle.events.put_nowait(Finished(reason))

    def _publish_gauges(self, step: StepPlan | None = None) -> None:
        """Wake ``wait_idle`` when nothing is in flight and set the scheduler gauges (a no-op once frozen)."""
        if not self._handles:
            self._idle.set()
        waiting = len(self.scheduler.waiting)
        self.metrics.set_scheduler_state(running=len(self.scheduler.running), waiting=waiting,
                                         waiting_for_capacity=waiting, kv_usage=self.scheduler.kv_usage, step=step)


def prompt_token_estimate(text: str) -> int:
    """Approximate tokenisation shared by every endpoint: one token per four characters, at least one."""
    return max(1, math.ceil(len(text) / 4))
