"""The ladder past max-num-seqs: engine flags the governor adds, one canary at a time, when lowering cannot help.

The practitioners' order under latency pressure is a smaller ``--max-num-seqs`` first, then
``--disable-custom-all-reduce`` (multi-GPU engines), then ``--block-size`` (docs/design.md). A policy lists those rungs
in its action's ``then``; when a breaching replica is at the governor's floor, or lowering it would cost more
throughput than allowed, ``past_max_num_seqs`` proposes the first rung the replica can take as an
``add_engine_flag`` canary, or, with none left, a warning that says why each rung was skipped. Pure.

What the governor remembers of rungs comes from the fleet, not from state of its own: a rung set is in the
replica's arguments; a rung taken back is in the snapshot's ``flag_trials`` (read from the action records);
readings of the engine running now are the samples at the replica's generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from controlplane.policy.actions import FlagRung, LowerMaxNumSeqsAction
from controlplane.policy.conditions import ThresholdCondition
from controlplane.policy.detectors.findings import Finding
from controlplane.policy.detectors.slo import detect_threshold
from controlplane.policy.durations import format_duration
from controlplane.policy.engine_args import has_flag, spans_gpus
from controlplane.policy.payloads import AddEngineFlagPayload, AlertPayload, Judge
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction, replica_target
from controlplane.policy.snapshot import FlagTrial, Replica, ReplicaSample
from engines import ADAPTERS


def at_generation(replica: Replica) -> list[ReplicaSample]:
    """History read from the engine the replica runs now (since its last restart into a new generation)."""
    return [s for s in replica.history if s.generation in (None, replica.generation)]


def next_rung(replica: Replica, action: LowerMaxNumSeqsAction, trials: Sequence[FlagTrial],
              now: datetime) -> tuple[int, FlagRung] | str:
    """The first rung of ``then`` this replica can still take (1-based position, rung), or why there is none."""
    skipped: list[str] = []
    engine = replica.engine
    for position, rung in enumerate(action.then, start=1):
        if rung.flag not in engine.rungs.known and any(rung.flag in a.rungs.known for a in ADAPTERS.values()):
            skipped.append(f"{rung.label} is no {engine.title} flag")
            continue
        if has_flag(replica.engine_args, rung.flag, rung.text):
            skipped.append(f"{rung.label} already set")
            continue
        if rung.multi_gpu and not spans_gpus(replica.engine_args, replica.gpus):
            skipped.append(f"{rung.label} is for multi-GPU engines")
            continue
        taken_back = [t for t in trials if t.model == replica.model and t.flag == rung.flag and t.value == rung.text
                      and now - t.at < timedelta(seconds=rung.retry_after)]
        if taken_back:
            last = max(taken_back, key=lambda t: t.at)
            skipped.append(f"{rung.label} taken back at {last.at.isoformat(timespec='seconds')} ({last.outcome}), "
                           f"not retried for {format_duration(rung.retry_after)}")
            continue
        return position, rung
    if not action.then:
        return "no further rung is configured (then)"
    return "no rung left: " + "; ".join(skipped)


def past_max_num_seqs(policy: Policy, cond: ThresholdCondition, action: LowerMaxNumSeqsAction, replica: Replica,
                      finding: Finding, why: str, max_num_seqs: int, now: datetime,
                      trials: Sequence[FlagTrial]) -> list[ProposedAction]:
    """max-num-seqs cannot go lower and the SLO still breaches: the next flag rung as a canary, else a warning.

    Both are judged on the engine the replica runs now: the breach must hold on samples since its last
    restart into a new generation (the caller has checked that no replica of the model is restarting).
    """
    current = detect_threshold(cond, replica, now, at_generation(replica))
    if current is None:
        return []  # the breach predates this engine's last restart: let the engine it runs now show its own
    found = next_rung(replica, action, trials, now)
    if isinstance(found, str):
        # ``governed``: held back while a change of this model is still being judged (it may yet help).
        return [ProposedAction(
            policy=policy.name, target=replica_target(replica),
            payload=AlertPayload(severity="warning", governed=True), model=replica.model, findings=[finding],
            reason=f"{finding.summary}; {why}; {found}: the tuning ladder cannot help, look at the load or add "
            "capacity", runbook_url=policy.runbook_url)]
    position, rung = found
    change = AddEngineFlagPayload(
        flag=rung.flag, value=rung.text, rung=position, multi_gpu=rung.multi_gpu, max_num_seqs=max_num_seqs,
        canary=action.canary,
        # Judged against the peers that run what the canary ran before (same max-num-seqs, without the flag),
        # else against its own readings before the change; it must cut the governed p99 by min_gain.
        judge=Judge(latencies=[cond.signal], max_throughput_drop=action.max_throughput_drop,
                    min_latency_gain=rung.min_gain, baseline="same_args"))
    change = change.model_copy(update={"engine_args": {replica.key: change.derive(replica.engine_args)}})
    return [ProposedAction(
        policy=policy.name, target=replica_target(replica), payload=change,
        replicas=[replica.key], model=replica.model, findings=[current],
        reason=f"{current.summary}; {why}: next rung {position} of {len(action.then)}, add {rung.label} (canary on "
        "one replica, judged against its baseline, then rolled to the model's other replicas that take it)",
        runbook_url=policy.runbook_url)]

