"""Continuous-batching scheduler in the style of vLLM V1: pure bookkeeping, no clock and no IO.

Each step the scheduler first gives every running sequence the tokens it needs (one decode token, or the next
chunk of its prefill), then admits waiting sequences in arrival order while the running count stays under
``max_num_seqs``, the step's token budget (``max_num_batched_tokens``, chunked prefill) lasts and KV blocks
are free. When a running sequence cannot get a block, the most recently admitted sequence is preempted: its
KV is freed and it goes back to the front of the queue to be recomputed, as V1's recompute preemption does.
A sequence that cannot fit even alone is the engine's out-of-memory death.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class KvCacheExhausted(RuntimeError):
    """One sequence needs more KV blocks than the whole cache holds: the engine dies of CUDA OOM."""

    def __init__(self, request_id: str, needed_blocks: int, total_blocks: int) -> None:
        super().__init__(f"request {request_id} needs {needed_blocks} KV blocks, cache has {total_blocks}")
        self.request_id = request_id
        self.needed_blocks = needed_blocks
        self.total_blocks = total_blocks


@dataclass(eq=False)
class Sequence:
    """One request as the scheduler sees it: token counts only."""

    request_id: str
    prompt_tokens: int
    output_tokens: int  # how many tokens it will generate in all
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    generated: int = 0
    computed: int = 0  # tokens whose KV is in the cache
    blocks: int = 0
    num_preemptions: int = 0
    ever_scheduled: bool = False
    running: bool = False  # in the batch (kept here so membership checks cost O(1) at batch 256)
    queued: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.generated >= self.output_tokens


@dataclass
class StepPlan:
    """What one step runs: new tokens per sequence, and what the scheduler did to get there."""

    scheduled: dict[Sequence, int] = field(default_factory=dict)
    newly_admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())

    @property
    def prefill_tokens(self) -> int:
        """Tokens computed beyond the one decode token a sequence needs per step."""
        return sum(n - 1 for n in self.scheduled.values() if n > 1)


@dataclass
class StepOutcome:
    """Per sequence after a step: whether it emitted a token, and which sequences finished."""

    emitted: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    prefill_done: list[Sequence] = field(default_factory=list)


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Scheduler:
    """The waiting queue, the running batch and the KV block pool of one engine."""

    def __init__(self, *, max_num_seqs: int, max_num_batched_tokens: int, total_blocks: int, block_size: int):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.free_blocks = total_blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # A live cap on the running batch, read at each step (a scheduler plug-in's, ``--scheduler-cls``);
        # None: the startup limit only.
        self.cap: Callable[[], int] | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_usage(self) -> float:
        return 0.0 if self.total_blocks == 0 else 1.0 - self.free_blocks / self.total_blocks

    def add(self, seq: Sequence) -> None:
        seq.computed = seq.cached_tokens
        seq.queued = True
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is (client gone, abort), freeing its blocks."""
        if seq.running:
            self.running.remove(seq)
        elif seq.queued:
            self.waiting.remove(seq)
        seq.running = seq.queued = False
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def _grow(self, seq: Sequence, new_tokens: int) -> bool:
        need = _blocks_for(seq.computed + new_tokens, self.block_size) - seq.blocks
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        seq.blocks += need
        return True

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        if self.running[-1] is seq:
            self.running.pop()
        else:
            self.running.remove(seq)
        seq.running, seq.queued = False, True
        self.free_blocks += seq.blocks
        seq.blocks = 0
        seq.computed = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)
        plan.scheduled.pop(seq, None)

    def schedule(self) -> StepPlan:
        """Choose this step's batch; raises KvCacheExhausted if a lone sequence cannot fit.

        Under a live cap the step sees only the first ``cap`` running sequences, as vLLM's scheduler does under
        the live-cap plug-in: the ones admitted last keep their KV blocks and their place, are not stepped
        (nor preempted) until those before them finish, and nothing new is admitted while the cap is full."""
        limit = self.max_num_seqs if self.cap is None else min(self.cap(), self.max_num_seqs)
        if len(self.running) <= limit:
            return self._schedule(limit)
        held = self.running[limit:]
        del self.running[limit:]
        try:
            return self._schedule(limit)
        finally:
            self.running.extend(held)

    def _schedule(self, limit: int) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        for seq in list(self.running):
            if not seq.running or budget <= 0:
                continue  # preempted earlier in this loop, or budget spent
            n = min(seq.num_tokens - seq.computed, budget)
            while not self._grow(seq, n):
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    raise KvCacheExhausted(seq.request_id, _blocks_for(seq.computed + n, self.block_size),
                                           self.total_blocks)
                self._preempt(victim, plan)
                if victim is seq:
                    break
            if seq.running:
                plan.scheduled[seq] = n
                budget -= n
        if plan.preempted:
            return plan  # like V1: no new admissions in a step that had to preempt
        while self.waiting and budget > 0 and len(self.running) < limit:
            seq = self.waiting[0]
            n = min(seq.num_tokens - seq.computed, budget)
            if not self._grow(seq, n):
                if not self.running:
                    raise KvCacheExhausted(seq.request_id, _blocks_for(seq.computed + n, self.block_size),
                                           self.total_blocks)
                break
            self.waiting.popleft()
            self.running.append(seq)
            seq.queued, seq.running = False, True
            plan.scheduled[seq] = n
            budget -= n
            if not seq.ever_scheduled:
                seq.ever_scheduled = True
                plan.newly_admitted.append(seq)
        return plan

    def complete(self, plan: StepPlan) -> StepOutcome:
        """Apply a finished step: advance computed tokens, sample one token where the prefill is complete."""
        out = StepOutcome()
        for seq, n in plan.scheduled.items():
            if not seq.running:
                continue  # removed while the step ran
            was_prefilling = seq.generated == 0 and seq.computed < seq.prompt_tokens
            seq.computed += n
            if seq.computed < seq.num_tokens:
                continue  # a chunk of a longer prefill
            if was_prefilling:
                out.prefill_done.append(seq)
            seq.generated += 1
            out.emitted.append(seq)
            if seq.finished:
                out.finished.append(seq)
                self.remove(seq)
        return out
