"""Rollouts: rolling restarts and canaried engine-argument changes, one batch at a time, resumable.

A rollout's whole progress lives in its action row (``params["rollout"]``), never in memory, so a control
plane that restarts mid-rollout (or a new leader) carries on from the batch it was in. Each executor round
calls ``advance``: when the current batch reports READY at its new generation the next batch starts, if the
model's disruption budget still holds without it (drain -> stop -> start -> warm -> READY is the agent's).

A canary (a governed ``--max-num-seqs`` change, or a flag rung, on one replica with peers) first converges on
its own, then runs beside its peers for ``canary_window``; ``canary.judge_canary`` compares them over the
window's second half (the first is the canary's warm-up under load), and the change is rolled to the peers
one at a time (pass) or the canary gets its previous arguments back (fail -> ``rolled_back``).

A flag rung (``add_engine_flag``) is judged against a like-for-like baseline: the ready peers tuned as the
canary was before (its max-num-seqs, without the flag, on several GPUs for a multi-GPU rung); without any,
the canary's own readings over the half-window before its change. It must also cut the governed latency by
the rung's ``min_latency_gain``. On a pass it goes to the peers that take it (a multi-GPU rung skips one-GPU
engines) and lack it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.wire import ReplicaState
from controlplane.fleet.desired import DesiredChange, set_desired
from controlplane.policy.engine_args import get_flag, get_int_flag, has_flag, set_flag, spans_gpus, with_flag
from controlplane.policy.guardrails import GuardConfig
from controlplane.remediation.canary import LATENCIES, judge_canary
from controlplane.store.models import ActionRow, Replica, Sample

FLAG = "--max-num-seqs"
GOVERNED = frozenset({"lower_max_num_seqs", "raise_max_num_seqs", "add_engine_flag"})
Verdict = tuple[str, str]


@dataclass(frozen=True)
class RolloutSettings:
    deadline: timedelta = timedelta(minutes=10)  # per batch
    canary_window: timedelta = timedelta(minutes=2)
    max_latency_regression: float = 0.10
    max_throughput_drop: float = 0.25
    guard: GuardConfig = field(default_factory=GuardConfig)


def is_rollout(row: ActionRow) -> bool:
    """Actions the rollout runs: rolling restarts, multi-replica argument changes, and canaries."""
    if row.kind == "rolling_restart":
        return True
    if row.kind in GOVERNED:
        return len(row.replicas) > 1 or bool(row.params.get("canary"))
    return False


def _key(replica: Replica) -> str:
    return f"{replica.node}/{replica.name}"


def _split(key: str) -> tuple[str, str]:
    node, _, name = key.partition("/")
    return node, name


def _args_for(row: ActionRow, key: str, replica: Replica | None) -> list[str] | None:
    """New arguments for ``key`` (None: a plain restart with the same arguments)."""
    if row.kind == "rolling_restart":
        return None
    given: Any = row.params.get("engine_args")
    if isinstance(given, dict) and key in given:
        return [str(a) for a in given[key]]
    # A peer the governor did not list: its own arguments with the canary's change.
    base = list(replica.engine_args) if replica is not None else []
    if row.kind == "add_engine_flag":
        return with_flag(base, str(row.params["flag"]), _value(row))
    return set_flag(base, FLAG, str(row.params["max_num_seqs"]))


def _value(row: ActionRow) -> str | None:
    value = row.params.get("value")
    return None if value is None else str(value)


def _change(row: ActionRow) -> str:
    """The change in words: ``--max-num-seqs 32`` or ``--disable-custom-all-reduce``."""
    if row.kind == "add_engine_flag":
        value = _value(row)
        return str(row.params["flag"]) + ("" if value is None else f" {value}")
    return f"{FLAG} {row.params.get('max_num_seqs')}"


def _needs(row: ActionRow, replica: Replica) -> bool:
    """Whether a peer still lacks the canary's change (and takes it: a multi-GPU rung skips one-GPU engines)."""
    args = [str(a) for a in replica.engine_args]
    if row.kind == "add_engine_flag":
        if row.params.get("multi_gpu") and not spans_gpus(args, list(replica.gpus)):
            return False
        return not has_flag(args, str(row.params["flag"]), _value(row))
    return get_int_flag(args, FLAG) != int(row.params["max_num_seqs"])


def _start_batch(session: Session, row: ActionRow, plan: dict[str, Any], keys: Sequence[str],
                 now: datetime) -> None:
    applied: dict[str, int] = {}
    for key in keys:
        node, name = _split(key)
        args = _args_for(row, key, session.get(Replica, (node, name)))
        change = DesiredChange(restart=True, enabled=True) if args is None else DesiredChange(engine_args=args,
                                                                                              enabled=True)
        applied[key] = set_desired(session=session, node=node, name=name, change=change, now=now).generation
    plan["batch"], plan["batch_started_at"] = applied, now.isoformat()
    plan.pop("waiting", None)


def _save(row: ActionRow, plan: dict[str, Any], now: datetime) -> None:
    row.params = {**row.params, "rollout": dict(plan)}
    row.updated_at = now


def start(*, session: Session, row: ActionRow, now: datetime) -> None:
    """Plan the rollout in the row and start its first batch (the canary, for a canary)."""
    if row.kind in GOVERNED and row.params.get("canary") and len(row.replicas) == 1:
        replica = session.get(Replica, _split(row.replicas[0]))
        plan: dict[str, Any] = {"phase": "canary", "queue": [], "done": [], "canary": row.replicas[0],
                                "previous_args": [] if replica is None else list(replica.engine_args)}
        _start_batch(session, row, plan, row.replicas, now)
    else:
        size = int(row.params.get("batch_size", 1)) if row.kind == "rolling_restart" else 1
        keys = list(row.replicas)
        batches = [keys[i:i + size] for i in range(0, len(keys), size)]
        plan = {"phase": "rolling", "queue": batches, "done": []}
    _save(row, plan, now)


def _batch_state(session: Session, batch: dict[str, int]) -> tuple[list[str], str | None]:
    """(keys still converging, why the batch failed or None)."""
    pending = []
    for key, generation in batch.items():
        replica = session.get(Replica, _split(key))
        if replica is not None and replica.state == ReplicaState.FATAL.value:
            return [], f"{key} is FATAL (exit code {replica.last_exit_code})"
        if not (replica is not None and replica.generation >= generation and replica.ready
                and replica.state == ReplicaState.READY.value):
            pending.append(key)
    return pending, None


def _budget_allows(session: Session, model: str | None, batch: Sequence[str], guard: GuardConfig) -> str | None:
    if model is None:
        return None
    members = list(session.scalars(select(Replica).where(Replica.model == model)))
    rule = guard.budget_for(model)
    floor = max(rule.min_ready, math.ceil(rule.min_ready_ratio * len(members)))
    serving = [r for r in members if r.ready and r.state == ReplicaState.READY.value and _key(r) not in batch]
    if len(serving) < floor and any(k in {_key(r) for r in members if r.ready} for k in batch):
        return f"waiting: {len(serving)} other replica(s) of {model} READY, budget needs {floor}"
    return None


def _window(session: Session, key: str, since: datetime, until: datetime | None = None) -> list[dict[str, Any]]:
    node, name = _split(key)
    query = select(Sample.values).where(Sample.node == node, Sample.subject_kind == "replica",
                                        Sample.subject == name, Sample.at >= since, Sample.resolution_seconds == 0)
    if until is not None:
        query = query.where(Sample.at < until)
    return [dict(v) for v in session.scalars(query)]


def _like_for_like(row: ActionRow, plan: dict[str, Any], peers: Sequence[Replica]) -> list[Replica]:
    """Peers tuned as the canary was before its change: its max-num-seqs and this flag's setting, on as many
    GPUs when the rung is for multi-GPU engines (ports and other per-instance arguments may differ)."""
    before = [str(a) for a in plan.get("previous_args") or []]
    flag = str(row.params["flag"])

    def tuning(args: Sequence[str]) -> tuple[int | None, str | None, bool]:
        return get_int_flag(args, FLAG), get_flag(args, flag), flag in args

    def alike(peer: Replica) -> bool:
        args = [str(a) for a in peer.engine_args]
        takes = not row.params.get("multi_gpu") or spans_gpus(args, list(peer.gpus))
        return peer.ready and takes and tuning(args) == tuning(before)

    return [p for p in peers if alike(p)]


def _judge(session: Session, row: ActionRow, plan: dict[str, Any], now: datetime,
           settings: RolloutSettings) -> Verdict | None:
    """The canary phase once the canary is READY: wait out the window, compare, then promote or roll back."""
    ready_at = datetime.fromisoformat(plan.setdefault("canary_ready_at", now.isoformat()))
    key = plan["canary"]
    peers = [r for r in session.scalars(select(Replica).where(Replica.model == row.model))
             if _key(r) != key and r.managed]
    # A lone replica has no peers to compare with: its own SLO is the governor's to judge, next round. A flag
    # rung always has a baseline (its own readings before the change, at worst), so it waits out the window.
    judged_alone = not peers and row.kind != "add_engine_flag"
    if not judged_alone and now - ready_at < settings.canary_window:
        return None
    # The governor says what the change is judged on (its signal, the throughput a lowering may cost).
    judge: dict[str, Any] = row.params.get("judge") or {}
    latencies = judge.get("latencies") or LATENCIES
    drop = judge.get("max_throughput_drop")
    gain = judge.get("min_latency_gain")
    # Judged on the second half of the window: in the first, the canary warms up under live load (a fresh
    # engine's first steps are slower, and its empty batch refills all at once), which is not its steady state.
    since = ready_at + settings.canary_window / 2
    if judge.get("baseline") == "same_args":
        alike = _like_for_like(row, plan, peers)
        plan["baseline"] = [_key(p) for p in alike] or "itself before the change"
        started = datetime.fromisoformat(plan["batch_started_at"])
        # Nobody runs the old arguments any more: the canary's own readings before its change.
        baseline = ([_window(session, _key(p), since) for p in alike] if alike
                    else [_window(session, key, started - settings.canary_window / 2, started)])
    else:
        baseline = [_window(session, _key(p), since) for p in peers]
    verdict = judge_canary(_window(session, key, since), baseline, settings.max_latency_regression,
                           settings.max_throughput_drop if drop is None else float(drop), latencies,
                           min_latency_gain=None if gain is None else float(gain))
    plan["canary_verdict"] = {"verdict": verdict.verdict, "reason": verdict.reason, "figures": verdict.figures}
    if verdict.verdict == "wait":
        return None
    plan["done"] = [key]
    if verdict.verdict == "fail":
        node, name = _split(key)
        previous = [str(a) for a in plan.get("previous_args") or []]
        set_desired(session=session, node=node, name=name, change=DesiredChange(engine_args=previous, enabled=True),
                    now=now)
        plan["phase"], plan["batch"] = "rolled_back", {}
        if row.kind == "add_engine_flag":
            return "rolled_back", f"{verdict.reason}; {key} rolled back to its arguments without {_change(row)}"
        return "rolled_back", f"{verdict.reason}; {key} rolled back to {FLAG} {row.params.get('previous')}"
    plan["phase"], plan["batch"] = "rolling", {}
    plan["queue"] = [[_key(p)] for p in sorted(peers, key=_key) if _needs(row, p)]
    return None


def advance(*, session: Session, row: ActionRow, now: datetime, settings: RolloutSettings) -> Verdict | None:
    """One step of a running rollout; (final state, outcome) when it is over."""
    plan: dict[str, Any] = dict(row.params.get("rollout") or {})
    verdict = _step(session, row, plan, now, settings)
    _save(row, plan, now)
    return verdict


def _step(session: Session, row: ActionRow, plan: dict[str, Any], now: datetime,
          settings: RolloutSettings) -> Verdict | None:
    batch: dict[str, int] = plan.get("batch") or {}
    if batch:
        pending, failure = _batch_state(session, batch)
        if failure is not None:
            return "failed", failure
        if pending:
            started = datetime.fromisoformat(plan["batch_started_at"])
            if now - started > settings.deadline:
                return "failed", (f"deadline of {settings.deadline.total_seconds():g}s passed; waiting on "
                                  f"{', '.join(pending)}")
            return None
        if plan.get("phase") == "canary":
            verdict = _judge(session, row, plan, now, settings)
            if verdict is not None or plan["phase"] == "canary":
                return verdict
        else:
            plan["done"] = [*plan.get("done", []), *batch]
            plan["batch"] = {}
    queue: list[list[str]] = plan.get("queue", [])
    if not queue:
        done = plan.get("done", [])
        return "succeeded", f"{len(done)} replica(s) READY at their new generation: {', '.join(done)}"
    waiting = _budget_allows(session, row.model, queue[0], settings.guard)
    if waiting is not None:
        plan["waiting"] = waiting
        return None
    _start_batch(session, row, plan, queue[0], now)
    plan["queue"] = queue[1:]
    return None
