"""The continuous-batching scheduler: admission limits, chunked prefill, preemption, out-of-memory."""

from __future__ import annotations

import pytest

from enginesim.scheduler import KvCacheExhausted, Scheduler, Sequence


def seq(name: str, prompt: int, output: int) -> Sequence:
    return Sequence(request_id=name, prompt_tokens=prompt, output_tokens=output)


def run_step(s: Scheduler) -> list[Sequence]:
    plan = s.schedule()
    return s.complete(plan).emitted


def test_admits_no_more_than_max_num_seqs() -> None:
    s = Scheduler(max_num_seqs=2, max_num_batched_tokens=1000, total_blocks=100, block_size=16)
    for i in range(5):
        s.add(seq(f"r{i}", 10, 5))
    plan = s.schedule()
    assert [q.request_id for q in plan.scheduled] == ["r0", "r1"]
    assert len(s.waiting) == 3


def test_long_prompt_is_prefilled_in_chunks_within_the_token_budget() -> None:
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=100, total_blocks=100, block_size=16)
    s.add(seq("long", 250, 3))
    emitted = [run_step(s) for _ in range(3)]
    assert [len(e) for e in emitted] == [0, 0, 1]  # 100 + 100 + 50 tokens, then the first token
    assert s.running[0].generated == 1


def test_every_running_sequence_gets_one_token_per_step_and_frees_blocks_when_done() -> None:
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=1000, total_blocks=100, block_size=16)
    s.add(seq("a", 16, 2))
    s.add(seq("b", 16, 4))
    steps = [len(run_step(s)) for _ in range(4)]
    assert steps == [2, 2, 1, 1]
    assert s.free_blocks == 100 and not s.has_work


def test_preempts_the_most_recently_admitted_when_blocks_run_out() -> None:
    # 4 blocks of 4 tokens; two sequences of 7 prompt tokens take 2 blocks each, the 9th token needs a third.
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=100, total_blocks=4, block_size=4)
    s.add(seq("old", 7, 10))
    s.add(seq("new", 7, 10))
    run_step(s)  # both prefilled, each has 8 tokens in 2 blocks
    run_step(s)  # 8th token computed: still fits
    plan = s.schedule()
    assert [q.request_id for q in plan.preempted] == ["new"]
    assert s.waiting[0].request_id == "new" and s.waiting[0].computed == 0
    assert s.waiting[0].num_preemptions == 1


def test_a_sequence_larger_than_the_whole_cache_is_out_of_memory() -> None:
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=100, total_blocks=2, block_size=4)
    s.add(seq("huge", 7, 5))
    run_step(s)
    with pytest.raises(KvCacheExhausted):
        for _ in range(5):
            run_step(s)


def test_a_waiting_sequence_waits_for_blocks_while_others_run() -> None:
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=100, total_blocks=3, block_size=4)
    s.add(seq("a", 8, 2))
    s.add(seq("b", 8, 2))
    plan = s.schedule()
    assert [q.request_id for q in plan.scheduled] == ["a"]
    assert s.kv_usage == pytest.approx(2 / 3)


def test_a_live_cap_steps_only_the_first_admitted_holds_the_rest_with_their_blocks_and_admits_nothing() -> None:
    # What vLLM's scheduler does under the live-cap plug-in (tests/live_cap): the simulator must agree.
    cap = [8]
    s = Scheduler(max_num_seqs=8, max_num_batched_tokens=1000, total_blocks=100, block_size=16)
    s.cap = lambda: cap[0]
    for i in range(8):
        s.add(seq(f"r{i}", 16, 50))
    run_step(s)  # all eight prefilled
    blocks = s.free_blocks
    cap[0] = 2
    s.add(seq("late", 16, 5))
    emitted = run_step(s)
    assert [q.request_id for q in emitted] == ["r0", "r1"]  # from the next step on, two at a time
    assert [q.request_id for q in s.running] == [f"r{i}" for i in range(8)]  # held, in their place
    assert s.free_blocks <= blocks and [q.request_id for q in s.waiting] == ["late"]  # nothing preempted or admitted
    cap[0] = 64  # never above the startup limit
    assert len(run_step(s)) == 8 and [q.request_id for q in s.waiting] == ["late"]


def test_held_sequences_move_up_as_the_capped_ones_finish() -> None:
    cap = [1]
    s = Scheduler(max_num_seqs=4, max_num_batched_tokens=1000, total_blocks=100, block_size=16)
    s.add(seq("a", 16, 2))
    s.add(seq("b", 16, 2))
    s.cap = None
    run_step(s)  # both admitted and prefilled (one token each)
    s.cap = lambda: cap[0]
    assert [q.request_id for q in run_step(s)] == ["a"]  # a finishes
    assert [q.request_id for q in run_step(s)] == ["b"]  # b, held behind it, goes next: not starved
    assert not s.has_work
