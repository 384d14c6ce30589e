"""The ladder past max-num-seqs on the real app (SQLite, fake clock): flag rungs as canaries, rolled or taken back.

Replicas already at the governor's floor (16) that still breach the ITL SLO get the shipped policy's next rung
(``--disable-custom-all-reduce`` on multi-GPU engines, then ``--block-size 32``) on one replica; the canary is
judged against the peers that still run what it ran before, must cut ITL p99 by 5 % without losing more than
35 % throughput, and is then rolled to the peers that take it, or given its old arguments back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.console import actions
from tests.remediation.fleet import SimAgent, SimReplica, fleet

TP2 = ["--max-num-seqs", "16", "--tensor-parallel-size", "2"]
ALL_REDUCE = "--disable-custom-all-reduce"


def at_floor(name: str, gpus: list[int], args: list[str] | None = None, itl: float = 0.3) -> SimReplica:
    return SimReplica(name, engine_args=list(args or TP2), gpus=gpus, itl=itl, running=16.0, tokens_per_second=800.0)


def by_kind(rows: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == kind]


def test_a_rung_that_cuts_itl_is_rolled_to_the_peers_that_take_it(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [at_floor("r0", [0, 1]), at_floor("r1", [2, 3], itl=0.4), at_floor("r2", [4, 5]),
                               at_floor("r3", [6], args=["--max-num-seqs", "16"], itl=0.05)])
    with fleet(tmp_path, [agent], canary_window_seconds=60) as f:
        f.run(90)
        [canary] = by_kind(f.actions(), "add_engine_flag")
        assert canary["policy"] == "itl-slo" and canary["target"] == "replica:gpu-a/r1"  # the worst one
        assert canary["params"]["flag"] == ALL_REDUCE and canary["params"]["canary"] is True
        assert "floor 16" in canary["reason"] and canary["evidence"][0]["evidence"]
        f.step(10, converge=True)
        r1 = agent.replica("r1")
        assert r1.engine_args == [*TP2, ALL_REDUCE] and r1.generation == 2
        r1.itl = 0.15  # NCCL all-reduce was the slow part: the canary meets the SLO, throughput unchanged
        f.run(80)
        judged = f.action(canary["id"])["params"]["rollout"]
        assert judged["canary_verdict"]["verdict"] == "pass", judged
        assert judged["baseline"] == ["gpu-a/r0", "gpu-a/r2"]  # multi-GPU peers still without the flag
        # What the console's action detail shows an on-call.
        lines = actions.evidence_lines(f.action(canary["id"]))
        assert "  judged against: gpu-a/r0, gpu-a/r2" in lines
        assert any("itl_p99_seconds 0.15 vs 0.3" in line for line in lines), lines
        for _ in range(6):
            before = [r.generation for r in agent.replicas]
            f.step(10, converge=True)
            assert sum(r.generation > b for r, b in zip(agent.replicas, before, strict=True)) <= 1
            for r in agent.replicas:  # every engine with the flag speeds up as the canary did
                r.itl = 0.15 if ALL_REDUCE in r.engine_args else r.itl
        done = f.action(canary["id"])
        assert done["state"] == "succeeded", done
        assert [r.engine_args[-1] == ALL_REDUCE for r in agent.replicas] == [True, True, True, False]
        assert agent.replica("r3").generation == 1, "a one-GPU engine does not take a multi-GPU rung"
        f.run(120)
        assert len(by_kind(f.actions(), "add_engine_flag")) == 1, "no second rung while the first rolled out"


def test_a_rung_that_does_not_help_is_taken_back_and_the_next_rung_follows(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [at_floor("r0", [0, 1]), at_floor("r1", [2, 3], itl=0.4), at_floor("r2", [4, 5])])
    with fleet(tmp_path, [agent], canary_window_seconds=60, guardrails={"breaker_max_failures": 5}) as f:
        f.run(90)
        [canary] = by_kind(f.actions(), "add_engine_flag")
        f.step(10, converge=True)
        agent.replica("r1").itl = 0.29  # 3 % better than its like-for-like peers' 0.3: not the 5 % asked for
        f.run(80)
        rolled = f.action(canary["id"])
        assert rolled["state"] == "rolled_back", rolled
        assert "must cut it by 5%" in rolled["outcome"] and f"without {ALL_REDUCE}" in rolled["outcome"]
        f.step(10, converge=True)
        assert agent.replica("r1").engine_args == TP2 and agent.replica("r1").generation == 3
        # The governor does not retry the rung that was taken back: the next one goes on a canary instead.
        f.run(120)
        rungs = sorted(by_kind(f.actions(), "add_engine_flag"), key=lambda r: r["id"])
        assert [r["params"]["flag"] for r in rungs] == [ALL_REDUCE, "--block-size"], rungs
        assert rungs[1]["params"]["value"] == "32"


def test_without_like_for_like_peers_a_rung_is_judged_against_the_canarys_own_past(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [at_floor("r0", [0, 1])])
    with fleet(tmp_path, [agent], canary_window_seconds=60,
               guardrails={"budget": {"min_ready": 0, "min_ready_ratio": 0}}) as f:
        f.run(90)
        [canary] = by_kind(f.actions(), "add_engine_flag")
        f.step(10, converge=True)
        agent.replica("r0").itl = 0.12
        f.run(30)
        assert f.action(canary["id"])["state"] == "running", "a rung waits out its window, even alone"
        f.run(50)
        done = f.action(canary["id"])
        assert done["state"] == "succeeded", done
        verdict = done["params"]["rollout"]["canary_verdict"]
        assert done["params"]["rollout"]["baseline"] == "itself before the change"
        assert verdict["figures"]["peers_itl_p99_seconds"] == 0.3
        assert verdict["figures"]["canary_itl_p99_seconds"] == 0.12
        assert agent.replica("r0").engine_args == [*TP2, ALL_REDUCE]
