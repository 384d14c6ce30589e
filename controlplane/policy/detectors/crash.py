"""Crash loops and out-of-memory crashes, read from the supervisor's state, the last exit and the log tail."""

from __future__ import annotations

from datetime import datetime

from agent.wire import ReplicaState
from controlplane.policy.conditions import CrashLoopCondition, OomCrashCondition
from controlplane.policy.detectors.findings import Evidence, Finding
from controlplane.policy.snapshot import Replica

TAIL_LINES = 20


def detect_crash_loop(cond: CrashLoopCondition, replica: Replica, now: datetime) -> Finding | None:
    """A finding when the supervisor gave up on the replica (FATAL after its start retries)."""
    if replica.state != ReplicaState.FATAL:
        return None
    tail = replica.log_tail[-TAIL_LINES:]
    return Finding(
        detector="crash_loop",
        subject=replica.key,
        summary=f"{replica.key} is FATAL after {replica.restarts_total} restarts (last exit code "
        f"{replica.last_exit_code})" + (f": {tail[-1]}" if tail else ""),
        measured={"restarts_total": replica.restarts_total, "last_exit_code": replica.last_exit_code},
        evidence=[Evidence(at=replica.state_since or now, values={"state": replica.state.value, "log_tail": tail})],
    )


def detect_oom_crash(cond: OomCrashCondition, replica: Replica, now: datetime) -> Finding | None:
    """A finding when the engine exited and its log tail says CUDA ran out of memory.

    vLLM's API server may exit with code 0 when its engine dies, so any recorded exit counts.
    """
    if replica.last_exit_code is None or replica.state in (ReplicaState.READY, ReplicaState.ATTACHED):
        return None
    hits = [line for line in replica.log_tail if any(p in line for p in cond.patterns)]
    if not hits:
        return None
    return Finding(
        detector="oom_crash",
        subject=replica.key,
        summary=f"{replica.key} exited (code {replica.last_exit_code}) out of GPU memory: {hits[-1][:200]}",
        measured={"last_exit_code": replica.last_exit_code, "max_num_seqs": replica.max_num_seqs},
        evidence=[Evidence(at=replica.state_since or now,
                           values={"state": replica.state.value, "log_tail": replica.log_tail[-TAIL_LINES:]})],
    )
