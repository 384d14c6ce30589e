"""What a policy asks of each engine's metrics, said before it runs: a latency target an engine cannot resolve.

An engine's TTFT histogram has a lowest bucket bound: SGLang's defaults start at 0.1 s, so a TTFT target below it
reads every fast request as "at most 0.1 s" and the target can be neither met nor missed in its figures, unless
the engine is started with bounds below the target (``--bucket-time-to-first-token``). Pure: ``pitstop policy
check`` prints what this returns (``controlplane/policy_cli.py``).
"""

from __future__ import annotations

from controlplane.policy.conditions import ThresholdCondition
from controlplane.policy.policy import Policy
from engines import ADAPTERS

_TTFT_SIGNALS = frozenset({"ttft_p50_seconds", "ttft_p95_seconds", "ttft_p99_seconds"})


def engine_notes(policy: Policy) -> list[str]:
    """One line per engine whose default TTFT buckets cannot resolve the policy's TTFT target."""
    cond = policy.condition
    if not isinstance(cond, ThresholdCondition) or cond.signal not in _TTFT_SIGNALS:
        return []
    notes = []
    for engine in ADAPTERS.values():
        if cond.threshold < engine.lowest_ttft_bucket:
            fix = (f"start {engine.title} with {engine.ttft_buckets_flag} bounds that include it"
                   if engine.ttft_buckets_flag else f"{engine.title} cannot be told finer buckets")
            notes.append(f"{cond.signal} threshold {cond.threshold:g} s is below {engine.title}'s lowest TTFT "
                         f"bucket ({engine.lowest_ttft_bucket:g} s): on {engine.title} replicas {fix}")
    return notes
