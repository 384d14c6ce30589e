"""The rollout step as a table: (plan, what the agents reported) -> (desired-state writes, verdict, the next plan).

No store and no clock: each case hands ``start`` or ``step`` the replicas as reported, their samples and
``now``, and checks what a user would see of the rollout: which replicas are asked to restart (and with which
arguments), when it waits and why, and how it ends.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.wire import LiveLimits, ReplicaState
from controlplane.policy.guardrails import BudgetRule, GuardConfig
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.payloads import (
    AddEngineFlagPayload,
    DrainPayload,
    Judge,
    MaxNumSeqsPayload,
    RestartPayload,
    RollingRestartPayload,
    RolloutPlan,
    SetFlagsPayload,
    SetLiveCapPayload,
)
from controlplane.policy.rollout import (
    DesiredWrite,
    Observed,
    ReplicaView,
    RolloutPayload,
    RolloutSettings,
    Step,
    is_rollout,
    progress,
    start,
    step,
)
from controlplane.policy.signals import ReplicaSample
from tests.policy.windows import SCRAPE, engine_steps, stream, window

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
MIN = timedelta(minutes=1)
MODEL = "llama-8b"
R = ReplicaState
K0, K1, K2, K3 = "gpu-a/r0", "gpu-a/r1", "gpu-b/r2", "gpu-b/r3"
AT_64 = ("--model", MODEL, "--max-num-seqs", "64")
AT_32 = ("--model", MODEL, "--max-num-seqs", "32")
FLAG = "--enable-chunked-prefill"


def view(key: str, state: ReplicaState = R.READY, generation: int = 1, *, args: Sequence[str] = AT_64,
         gpus: Sequence[int] = (0,), desired: int | None = None, ready: bool | None = None,
         exit_code: int | None = None, managed: bool = True, live: LiveLimits | None = None) -> ReplicaView:
    return ReplicaView(key=key, state=state, ready=state == R.READY if ready is None else ready,
                       generation=generation, engine_args=tuple(args), gpus=tuple(gpus), managed=managed,
                       last_exit_code=exit_code, desired_generation=desired, live_limits=live)


def capped(asked: int | None = None, *, active: bool = True) -> LiveLimits:
    """An engine's live-cap plug-in as its agent reports it, started at 64, ``asked``: what the agent wrote."""
    return LiveLimits(active=active, reason=None if active else "no max_num_active_reqs", startup_limit=64,
                      asked=asked, cap=asked or 64)


def seen(*views: ReplicaView, samples: Mapping[str, list[ReplicaSample]] | None = None) -> Observed:
    return Observed(replicas={v.key: v for v in views}, samples=samples or {})


def readings(since: datetime, n: int = 6, *, itl: float, ttft: float = 0.3, tps: float = 100.0
             ) -> list[ReplicaSample]:
    """``n`` samples ten seconds apart from ``since``, as the agents report them."""
    return [ReplicaSample(at=since + timedelta(seconds=10 * i), itl_p99_seconds=itl, ttft_p99_seconds=ttft,
                          generation_tokens_per_second=tps) for i in range(n)]


RESTART_2 = RollingRestartPayload(batch_size=2)
RESTART_1 = RollingRestartPayload(batch_size=1)
# The governor's canaries: judged on ITL and throughput (a smaller batch may move queueing into TTFT).
LOWER = MaxNumSeqsPayload(kind="lower_max_num_seqs", max_num_seqs=32, previous=64, canary=True,
                          judge=Judge(latencies=["itl_p99_seconds"]))
RAISE = MaxNumSeqsPayload(kind="raise_max_num_seqs", max_num_seqs=128, previous=64, canary=True)
# A flag rung must cut ITL by a fifth against engines tuned as the canary was.
RUNG = AddEngineFlagPayload(flag=FLAG, rung=1, max_num_seqs=64, canary=True,
                            judge=Judge(latencies=["itl_p99_seconds"], baseline="same_args", min_latency_gain=0.2))

# The governor's live step: a cap of 32 on engines started at 64, canary first, no restart.
LIVE = SetLiveCapPayload(live_cap=32, previous=None, canary=True, judge=Judge(latencies=["itl_p99_seconds"]))
LIVE_CANARY = RolloutPlan(phase="canary", canary=K0, previous_args=list(AT_64), batch={K0: 1}, batch_started_at=T0)
LIVE_JUDGED = LIVE_CANARY.model_copy(update={"canary_ready_at": T0 + MIN})

# The canary's plan right after ``start``: gpu-a/r0 restarting into generation 2 with the change.
CANARY = RolloutPlan(phase="canary", canary=K0, previous_args=list(AT_64), batch={K0: 2}, batch_started_at=T0)
# ... and once it was READY at T0 + 1 min: judged from T0 + 3 min on the samples from T0 + 2 min.
JUDGED = CANARY.model_copy(update={"canary_ready_at": T0 + MIN})
JUDGE_AT = T0 + 3 * MIN
HALF = T0 + 2 * MIN  # the second half of the canary window

DEFAULTS = RolloutSettings()
# A batch first seen READY at its new generation then: settled (past DEFAULTS.settle) by T0 + 3 min.
SETTLED = T0 + 2 * MIN
SEC = timedelta(seconds=1)
# llama-* keeps three READY: a rollout of three replicas waits once one is out.
STRICT = RolloutSettings(guard=GuardConfig(model_budgets={"llama-*": BudgetRule(min_ready=3)}))


@dataclass(frozen=True)
class Case:
    id: str
    action: RolloutPayload
    observed: Observed
    now: datetime
    # None: the rollout starts (``start`` over ``replicas``); else one ``step`` of the running plan.
    plan: RolloutPlan | None = None
    replicas: tuple[str, ...] = ()
    model: str | None = MODEL
    settings: RolloutSettings = DEFAULTS
    writes: tuple[DesiredWrite, ...] = ()
    verdict: ActionState | None = None
    # Words the verdict's outcome must contain.
    outcome: tuple[str, ...] = ()
    # The next plan's fields that matter for the case.
    plan_fields: Mapping[str, Any] = field(default_factory=dict)


CASES = [
    # --- live cap: no restart, no new generation, judged on the agent's report -------------------------------
    Case("live-canary-writes-the-cap-at-the-same-generation", LIVE,
         seen(view(K0, live=capped()), view(K1, live=capped())), T0, replicas=(K0,),
         writes=(DesiredWrite(K0, None, live=True, live_cap=32),),
         plan_fields={"phase": "canary", "batch": {K0: 1}, "canary": K0}),
    Case("live-canary-waits-for-the-agent-to-write-it", LIVE,
         seen(view(K0, live=capped()), view(K1, live=capped())), T0 + 10 * SEC, plan=LIVE_CANARY,
         plan_fields={"canary_ready_at": None}),
    Case("live-canary-fails-when-its-plug-in-is-no-longer-active", LIVE,
         seen(view(K0, live=capped(active=False)), view(K1, live=capped())), T0 + 10 * SEC, plan=LIVE_CANARY,
         verdict=ActionState.FAILED, outcome=("not active on gpu-a/r0", "no max_num_active_reqs")),
    Case("live-canary-passes-and-every-peer-takes-the-cap-at-once", LIVE,
         seen(view(K0, live=capped(32)), view(K1, live=capped()), view(K2, live=capped()),
              view(K3, live=capped(32)),
              samples={K0: readings(HALF, itl=0.020), K1: readings(HALF, itl=0.060), K2: readings(HALF, itl=0.060),
                       K3: readings(HALF, itl=0.020)}),
         JUDGE_AT, plan=LIVE_JUDGED,
         writes=(DesiredWrite(K1, None, live=True, live_cap=32), DesiredWrite(K2, None, live=True, live_cap=32)),
         plan_fields={"phase": "rolling", "queue": [], "batch": {K1: 1, K2: 1}}),
    Case("live-canary-that-fails-gets-its-previous-cap-back", LIVE.model_copy(update={"previous": 48}),
         seen(view(K0, live=capped(32)), view(K1, live=capped(48)),
              samples={K0: readings(HALF, itl=0.090), K1: readings(HALF, itl=0.020)}),
         JUDGE_AT, plan=LIVE_JUDGED, writes=(DesiredWrite(K0, None, live=True, live_cap=48),),
         verdict=ActionState.ROLLED_BACK, outcome=("rolled back to live cap 48",)),
    Case("live-rollout-ends-once-every-agent-wrote-it-with-no-settle-and-no-budget-wait", LIVE,
         seen(view(K0, live=capped(32)), view(K1, live=capped(32)), view(K2, live=capped(32))),
         T0 + 4 * MIN, plan=RolloutPlan(phase="rolling", done=[K0], batch={K1: 1, K2: 1}, batch_started_at=JUDGE_AT),
         settings=STRICT, verdict=ActionState.SUCCEEDED, outcome=("3 replica(s) at live cap 32 with no restart",)),
    # --- rolling restart -------------------------------------------------------------------------------------
    Case("rolling-start-batches-by-size-and-writes-nothing-yet", RESTART_2,
         seen(view(K0), view(K1), view(K2)), T0, replicas=(K0, K1, K2),
         plan_fields={"phase": "rolling", "queue": [[K0, K1], [K2]], "batch": {}, "done": [],
                      "batch_started_at": None}),
    Case("rolling-first-batch-starts-above-reported-and-desired-generation", RESTART_2,
         seen(view(K0, generation=3, desired=5), view(K1, generation=4), view(K2), view(K3)), T0 + MIN,
         plan=RolloutPlan(phase="rolling", queue=[[K0, K1], [K2, K3]]),
         writes=(DesiredWrite(K0, None), DesiredWrite(K1, None)),
         plan_fields={"batch": {K0: 6, K1: 5}, "queue": [[K2, K3]], "batch_started_at": T0 + MIN,
                      "waiting": None}),
    Case("rolling-batch-still-converging-waits", RESTART_1,
         seen(view(K0, R.WARMING, 2), view(K1)), T0 + 5 * MIN,
         plan=RolloutPlan(phase="rolling", queue=[[K1]], batch={K0: 2}, batch_started_at=T0),
         plan_fields={"batch": {K0: 2}, "queue": [[K1]], "done": []}),
    Case("rolling-ready-at-the-old-generation-is-not-done", RESTART_1,
         seen(view(K0, R.READY, 1), view(K1)), T0 + 5 * MIN,
         plan=RolloutPlan(phase="rolling", queue=[[K1]], batch={K0: 2}, batch_started_at=T0),
         plan_fields={"batch": {K0: 2}, "done": []}),
    Case("rolling-batch-past-its-deadline-fails-naming-the-pending", RESTART_2,
         seen(view(K0, R.READY, 2), view(K1, R.STARTING, 2), view(K2)), T0 + 10 * MIN + timedelta(seconds=1),
         plan=RolloutPlan(phase="rolling", queue=[[K2]], batch={K0: 2, K1: 2}, batch_started_at=T0),
         verdict=ActionState.FAILED, outcome=("deadline of 600s passed", f"waiting on {K1}")),
    Case("rolling-fatal-replica-fails-naming-it", RESTART_2,
         seen(view(K0, R.READY, 2), view(K1, R.FATAL, 2, exit_code=137), view(K2)), T0 + MIN,
         plan=RolloutPlan(phase="rolling", queue=[[K2]], batch={K0: 2, K1: 2}, batch_started_at=T0),
         verdict=ActionState.FAILED, outcome=(f"{K1} is FATAL", "exit code 137")),
    Case("rolling-batch-done-starts-the-next", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2)), T0 + 3 * MIN,
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0,
                          batch_ready_at=SETTLED),
         writes=(DesiredWrite(K1, None),),
         plan_fields={"done": [K0], "batch": {K1: 2}, "queue": [[K2]], "batch_started_at": T0 + 3 * MIN}),
    Case("rolling-batch-first-seen-ready-settles-before-the-next-leaves-rotation", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2)), T0 + 3 * MIN,
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0),
         plan_fields={"done": [], "batch": {K0: 2}, "queue": [[K1], [K2]], "batch_ready_at": T0 + 3 * MIN,
                      "waiting": f"settling: {K0} READY for 0 of 5s"}),
    Case("rolling-settling-batch-waits-out-the-settle", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2)), T0 + 3 * MIN + 4 * SEC,
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0,
                          batch_ready_at=T0 + 3 * MIN),
         plan_fields={"done": [], "batch": {K0: 2}, "batch_ready_at": T0 + 3 * MIN,
                      "waiting": f"settling: {K0} READY for 4 of 5s"}),
    Case("rolling-settled-batch-starts-the-next-at-the-settle", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2)), T0 + 3 * MIN + 5 * SEC,
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0,
                          batch_ready_at=T0 + 3 * MIN),
         writes=(DesiredWrite(K1, None),),
         plan_fields={"done": [K0], "batch": {K1: 2}, "batch_ready_at": None, "waiting": None}),
    Case("rolling-a-replica-that-leaves-ready-while-settling-settles-again", RESTART_1,
         seen(view(K0, R.BACKOFF, 2), view(K1), view(K2)), T0 + 3 * MIN + 4 * SEC,
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0,
                          batch_ready_at=T0 + 3 * MIN),
         plan_fields={"done": [], "batch": {K0: 2}, "batch_ready_at": None}),
    Case("rolling-without-a-settle-the-next-starts-at-ready", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2)), T0 + 3 * MIN, settings=RolloutSettings(settle=0 * SEC),
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0),
         writes=(DesiredWrite(K1, None),), plan_fields={"done": [K0], "batch": {K1: 2}}),
    Case("rolling-last-batch-settles-before-it-succeeds", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1, R.READY, 2), view(K2, R.READY, 2)), T0 + 9 * MIN,
         plan=RolloutPlan(phase="rolling", done=[K0, K1], batch={K2: 2}, batch_started_at=T0 + 6 * MIN),
         plan_fields={"done": [K0, K1], "batch": {K2: 2}, "batch_ready_at": T0 + 9 * MIN}),
    Case("rolling-waits-for-the-models-own-disruption-budget", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2)), T0 + 3 * MIN, settings=STRICT,
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0,
                          batch_ready_at=SETTLED),
         plan_fields={"done": [K0], "batch": {}, "queue": [[K1], [K2]],
                      "waiting": f"waiting: 2 other replica(s) of {MODEL} READY, budget needs 3"}),
    Case("rolling-budget-holds-when-a-peer-is-back", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2), view(K3)), T0 + 4 * MIN, settings=STRICT,
         plan=RolloutPlan(phase="rolling", queue=[[K1]], done=[K0], waiting="waiting: ..."),
         writes=(DesiredWrite(K1, None),), plan_fields={"waiting": None, "batch": {K1: 2}}),
    Case("rolling-another-models-budget-is-not-this-ones", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1), view(K2)), T0 + 3 * MIN, settings=STRICT, model="mistral-7b",
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0,
                          batch_ready_at=SETTLED),
         writes=(DesiredWrite(K1, None),), plan_fields={"waiting": None}),
    Case("rolling-a-replica-not-serving-costs-no-budget", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1, R.BACKOFF), view(K2)), T0 + 3 * MIN, settings=STRICT,
         plan=RolloutPlan(phase="rolling", queue=[[K1], [K2]], batch={K0: 2}, batch_started_at=T0,
                          batch_ready_at=SETTLED),
         writes=(DesiredWrite(K1, None),), plan_fields={"waiting": None, "batch": {K1: 2}}),
    Case("rolling-last-batch-done-succeeds-listing-the-replicas", RESTART_1,
         seen(view(K0, R.READY, 2), view(K1, R.READY, 2), view(K2, R.READY, 2)), T0 + 9 * MIN,
         plan=RolloutPlan(phase="rolling", done=[K0, K1], batch={K2: 2}, batch_started_at=T0 + 6 * MIN,
                          batch_ready_at=T0 + 8 * MIN),
         verdict=ActionState.SUCCEEDED,
         outcome=(f"3 replica(s) READY at their new generation: {K0}, {K1}, {K2}",),
         plan_fields={"done": [K0, K1, K2], "batch": {}, "queue": []}),
    # --- a governed change over several replicas: one at a time, each with its own arguments changed -------
    Case("change-without-canary-queues-one-replica-at-a-time",
         LOWER.model_copy(update={"canary": False}), seen(view(K0), view(K1)), T0, replicas=(K0, K1),
         plan_fields={"phase": "rolling", "queue": [[K0], [K1]], "canary": None}),
    Case("change-without-canary-writes-derived-arguments",
         LOWER.model_copy(update={"canary": False}),
         seen(view(K0, args=(*AT_64, "--port", "9001")), view(K1), view(K2)), T0,
         plan=RolloutPlan(phase="rolling", queue=[[K0], [K1]]),
         writes=(DesiredWrite(K0, ["--model", MODEL, "--port", "9001", "--max-num-seqs", "32"], lift_cap=True),),
         plan_fields={"batch": {K0: 2}}),
    # --- a max-num-seqs canary -------------------------------------------------------------------------------
    Case("canary-start-writes-the-change-to-the-canary-only", LOWER,
         seen(view(K0, desired=3), view(K1), view(K2)), T0, replicas=(K0,),
         writes=(DesiredWrite(K0, ["--model", MODEL, "--max-num-seqs", "32"], lift_cap=True),),
         plan_fields={"phase": "canary", "canary": K0, "previous_args": list(AT_64), "batch": {K0: 4},
                      "batch_started_at": T0, "queue": []}),
    Case("canary-converging-waits", LOWER,
         seen(view(K0, R.WARMING, 2, args=AT_32), view(K1), view(K2)), T0 + MIN, plan=CANARY,
         plan_fields={"phase": "canary", "canary_ready_at": None}),
    Case("canary-ready-waits-out-its-window", LOWER,
         seen(view(K0, R.READY, 2, args=AT_32), view(K1), view(K2)), T0 + MIN, plan=CANARY,
         plan_fields={"phase": "canary", "canary_ready_at": T0 + MIN, "canary_verdict": None,
                      "canary_judged_at": T0 + MIN + DEFAULTS.canary_window}),
    Case("canary-within-its-window-keeps-waiting", LOWER,
         seen(view(K0, R.READY, 2, args=AT_32), view(K1), view(K2)), T0 + 2 * MIN + timedelta(seconds=59),
         plan=JUDGED, plan_fields={"phase": "canary", "canary_ready_at": T0 + MIN}),
    Case("canary-with-too-few-samples-waits-for-more", LOWER,
         seen(view(K0, R.READY, 2, args=AT_32), view(K1), view(K2),
              samples={K0: readings(HALF, 1, itl=0.02), K1: readings(HALF, itl=0.02)}), JUDGE_AT, plan=JUDGED,
         plan_fields={"phase": "canary", "batch": {K0: 2}}),
    Case("canary-whose-readings-stopped-is-rolled-back-after-window-and-deadline", LOWER,
         seen(view(K0, R.READY, 2, args=AT_32), view(K1), view(K2),
              samples={K0: readings(HALF, 1, itl=0.02), K1: readings(HALF, itl=0.02)}),
         T0 + MIN + DEFAULTS.canary_window + DEFAULTS.deadline, plan=JUDGED,
         writes=(DesiredWrite(K0, list(AT_64)),), verdict=ActionState.ROLLED_BACK,
         outcome=("could not be judged within 720s", "rolled back to --max-num-seqs 64"),
         plan_fields={"phase": "rolled_back"}),
    Case("canary-passes-and-the-peers-that-need-it-follow-one-at-a-time", LOWER,
         seen(view(K0, R.READY, 2, args=AT_32), view(K1), view(K2), view(K3, args=AT_32),
              samples={K0: readings(HALF, itl=0.020, ttft=0.9, tps=95), K1: readings(HALF, itl=0.021, ttft=0.3),
                       K2: readings(HALF, itl=0.019), K3: readings(HALF, itl=0.020)}),
         JUDGE_AT, plan=JUDGED,
         writes=(DesiredWrite(K1, ["--model", MODEL, "--max-num-seqs", "32"], lift_cap=True),),
         plan_fields={"phase": "rolling", "done": [K0], "batch": {K1: 2}, "queue": [[K2]]}),
    Case("canary-fails-and-gets-its-previous-arguments-back", LOWER,
         seen(view(K0, R.READY, 2, args=AT_32), view(K1), view(K2),
              samples={K0: readings(HALF, itl=0.040), K1: readings(HALF, itl=0.020), K2: readings(HALF, itl=0.020)}),
         JUDGE_AT, plan=JUDGED, writes=(DesiredWrite(K0, list(AT_64)),), verdict=ActionState.ROLLED_BACK,
         outcome=("itl_p99_seconds", f"{K0} rolled back to --max-num-seqs 64"),
         plan_fields={"phase": "rolled_back", "done": [K0], "batch": {}, "queue": []}),
    Case("canary-losing-too-much-throughput-fails", LOWER,
         seen(view(K0, R.READY, 2, args=AT_32), view(K1),
              samples={K0: readings(HALF, itl=0.020, tps=50), K1: readings(HALF, itl=0.020, tps=100)}),
         JUDGE_AT, plan=JUDGED, writes=(DesiredWrite(K0, list(AT_64)),), verdict=ActionState.ROLLED_BACK,
         outcome=("generation_tokens_per_second", "rolled back to --max-num-seqs 64")),
    Case("canary-fatal-fails-before-any-judgement", LOWER,
         seen(view(K0, R.FATAL, 2, args=AT_32, exit_code=1), view(K1)), T0 + MIN, plan=CANARY,
         verdict=ActionState.FAILED, outcome=(f"{K0} is FATAL (exit code 1)",)),
    Case("lone-replica-has-no-peers-and-passes-once-converged", RAISE,
         seen(view(K0, R.READY, 2, args=("--max-num-seqs", "128"))), T0 + MIN, plan=CANARY,
         verdict=ActionState.SUCCEEDED, outcome=(f"1 replica(s) READY at their new generation: {K0}",),
         plan_fields={"phase": "rolling", "done": [K0], "queue": []}),
    Case("unmanaged-engines-are-no-peers", RAISE,
         seen(view(K0, R.READY, 2, args=("--max-num-seqs", "128")), view(K1, managed=False)), T0 + MIN,
         plan=CANARY, verdict=ActionState.SUCCEEDED, plan_fields={"queue": []}),
    # --- a flag rung: judged against engines tuned as the canary was ------------------------------------------
    Case("flag-rung-start-adds-the-flag-to-the-canary", RUNG, seen(view(K0), view(K1)), T0, replicas=(K0,),
         writes=(DesiredWrite(K0, [*AT_64, FLAG]),),
         plan_fields={"phase": "canary", "previous_args": list(AT_64), "batch": {K0: 2}}),
    Case("flag-rung-judged-against-like-for-like-peers", RUNG,
         seen(view(K0, R.READY, 2, args=(*AT_64, FLAG)), view(K1), view(K2, args=AT_32), view(K3, args=(*AT_64, FLAG)),
              # r2 (max-num-seqs 32) and r3 (already has the flag) are faster, but not what the canary was.
              samples={K0: readings(HALF, itl=0.015), K1: readings(HALF, itl=0.020),
                       K2: readings(HALF, itl=0.010), K3: readings(HALF, itl=0.010)}),
         JUDGE_AT, plan=JUDGED, writes=(DesiredWrite(K1, [*AT_64, FLAG]),),
         plan_fields={"baseline": [K1], "phase": "rolling", "done": [K0], "queue": [[K2]], "batch": {K1: 2}}),
    Case("flag-rung-that-cuts-too-little-is-rolled-back", RUNG,
         seen(view(K0, R.READY, 2, args=(*AT_64, FLAG)), view(K1),
              samples={K0: readings(HALF, itl=0.019), K1: readings(HALF, itl=0.020)}),
         JUDGE_AT, plan=JUDGED, writes=(DesiredWrite(K0, list(AT_64)),), verdict=ActionState.ROLLED_BACK,
         outcome=("must cut it by 20%", f"{K0} rolled back to its arguments without {FLAG}"),
         plan_fields={"baseline": [K1], "phase": "rolled_back"}),
    Case("flag-rung-without-alike-peers-is-judged-against-itself-before", RUNG,
         seen(view(K0, R.READY, 2, args=(*AT_64, FLAG)), view(K1, args=AT_32),
              # Its own readings in the half-window before the change; the peer is faster but tuned otherwise.
              samples={K0: [*readings(T0 - MIN, itl=0.030), *readings(HALF, itl=0.015)],
                       K1: readings(HALF, itl=0.005)}),
         JUDGE_AT, plan=JUDGED, writes=(DesiredWrite(K1, [*AT_32, FLAG]),),
         plan_fields={"baseline": "itself before the change", "phase": "rolling", "done": [K0], "queue": []}),
    Case("flag-rung-on-a-lone-replica-still-waits-out-its-window", RUNG,
         seen(view(K0, R.READY, 2, args=(*AT_64, FLAG))), T0 + MIN, plan=CANARY,
         plan_fields={"phase": "canary", "canary_ready_at": T0 + MIN}),
    Case("multi-gpu-rung-goes-only-to-multi-gpu-peers", RUNG.model_copy(update={"multi_gpu": True}),
         seen(view(K0, R.READY, 2, args=(*AT_64, FLAG), gpus=(0, 1)), view(K1, gpus=(2, 3)), view(K2, gpus=(0,)),
              samples={K0: readings(HALF, itl=0.010), K1: readings(HALF, itl=0.020), K2: readings(HALF, itl=0.001)}),
         JUDGE_AT, plan=JUDGED, writes=(DesiredWrite(K1, [*AT_64, FLAG]),),
         plan_fields={"baseline": [K1], "queue": []}),
]


def run(case: Case) -> Step:
    if case.plan is None:
        return start(case.action, list(case.replicas), case.observed, case.now)
    return step(case.action, case.plan, case.model, case.observed, case.now, case.settings)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rollout_step(case: Case) -> None:
    done = run(case)
    assert done.writes == list(case.writes)
    if case.verdict is None:
        assert done.verdict is None, done.verdict
    else:
        assert done.verdict is not None and done.verdict[0] is case.verdict, done.verdict
        for words in case.outcome:
            assert words in done.verdict[1], done.verdict[1]
    for name, expected in case.plan_fields.items():
        assert getattr(done.plan, name) == expected, (name, done.plan)


# --- judged on evidence: per-request latencies from the windows' histograms ----------------------------------
def _live_evidence(canary_median: float, windows: int) -> Observed:
    """The live canary K0 (cap taken at T0 + 1 min) and two peers, ``windows`` scrape windows after the cap."""
    rng = random.Random(5)
    taken = T0 + MIN
    return seen(view(K0, live=capped(32)), view(K1, live=capped()), view(K2, live=capped()),
                samples={K0: stream(rng, taken, windows, median=canary_median),
                         K1: stream(rng, taken, windows, median=0.06), K2: stream(rng, taken, windows, median=0.06)})


def test_a_live_canary_passes_as_soon_as_the_evidence_is_in_not_after_its_window() -> None:
    # Three windows after the cap took (15 s): its inter-token latency clearly below the peers'.
    done = step(LIVE, LIVE_JUDGED, MODEL, _live_evidence(0.045, 3), T0 + MIN + 3 * SCRAPE, DEFAULTS)
    assert done.plan.phase == "rolling" and done.plan.done == [K0]
    assert done.writes == [DesiredWrite(K1, None, live=True, live_cap=32), DesiredWrite(K2, None, live=True,
                                                                                       live_cap=32)]
    verdict = done.plan.canary_verdict
    assert verdict is not None and verdict.verdict == "pass" and verdict.reason.startswith("evidence in")
    assert verdict.figures["itl_z"] is not None and verdict.figures["itl_z"] < -verdict.figures["z_boundary"]
    # The p99 readings stand beside the evidence, as an operator reads them first.
    mine, theirs = verdict.figures["canary_itl_p99_seconds"], verdict.figures["peers_itl_p99_seconds"]
    assert mine is not None and theirs is not None and mine < theirs


def test_a_live_canary_clearly_worse_is_rolled_back_within_seconds() -> None:
    done = step(LIVE.model_copy(update={"previous": 48}), LIVE_JUDGED, MODEL, _live_evidence(0.12, 2),
                T0 + MIN + 2 * SCRAPE, DEFAULTS)
    assert done.verdict is not None and done.verdict[0] is ActionState.ROLLED_BACK
    assert "on the evidence" in done.verdict[1] and "rolled back to live cap 48" in done.verdict[1]
    assert done.writes == [DesiredWrite(K0, None, live=True, live_cap=48)]


def test_a_canary_still_undecided_keeps_its_evidence_in_the_plan_for_the_console() -> None:
    # One window: too few observations a side yet.
    done = step(LIVE, LIVE_JUDGED, MODEL, _live_evidence(0.06, 1), T0 + MIN + SCRAPE, DEFAULTS)
    assert done.verdict is None and done.plan.phase == "canary"
    verdict = done.plan.canary_verdict
    assert verdict is not None and verdict.verdict == "wait" and "evidence not yet in" in verdict.reason


def test_a_window_that_straddles_the_cap_is_not_evidence() -> None:
    # The cap took at T0 + 1 min; a window from 2 s before it holds requests served at the old cap.
    rng = random.Random(6)
    straddling = [window(T0 + MIN + 3 * SEC, engine_steps(rng, 400, 8, 0.2), steps=400)]
    observed = seen(view(K0, live=capped(32)), view(K1, live=capped()),
                    samples={K0: straddling, K1: stream(rng, T0 + MIN, 1, median=0.06, steps=400)})
    done = step(LIVE, LIVE_JUDGED, MODEL, observed, T0 + MIN + 10 * SEC, DEFAULTS)
    assert done.verdict is None and done.plan.canary_verdict is not None
    assert done.plan.canary_verdict.verdict == "wait"


def test_a_restarted_canary_is_judged_on_evidence_only_after_its_warm_up_half() -> None:
    rng = random.Random(7)
    observed = seen(view(K0, R.READY, 2, args=AT_32), view(K1), view(K2),
                    samples={K0: stream(rng, T0 + MIN, 18, median=0.045), K1: stream(rng, T0 + MIN, 18, median=0.06),
                             K2: stream(rng, T0 + MIN, 18, median=0.06)})
    warming = step(LOWER, JUDGED, MODEL, observed, T0 + MIN + 50 * SEC, DEFAULTS)
    assert warming.plan.phase == "canary" and warming.plan.canary_verdict is None
    # Half the window (60 s) then three windows of evidence: judged at 75 s, not at the window's 120 s.
    judged = step(LOWER, JUDGED, MODEL, observed, T0 + MIN + 75 * SEC, DEFAULTS)
    assert judged.plan.phase == "rolling" and judged.plan.done == [K0]


def test_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


def test_a_judged_canary_keeps_its_verdict_and_figures_in_the_plan() -> None:
    case = next(c for c in CASES if c.id == "canary-fails-and-gets-its-previous-arguments-back")
    verdict = run(case).plan.canary_verdict
    assert verdict is not None and verdict.verdict == "fail"
    assert verdict.figures["canary_itl_p99_seconds"] == pytest.approx(0.040)
    assert verdict.figures["peers_itl_p99_seconds"] == pytest.approx(0.020)


def test_a_lone_replica_passes_for_having_no_peers() -> None:
    case = next(c for c in CASES if c.id == "lone-replica-has-no-peers-and-passes-once-converged")
    verdict = run(case).plan.canary_verdict
    assert verdict is not None and verdict.verdict == "pass" and "no peers" in verdict.reason


def test_a_canarys_judgement_ignores_the_warm_up_half_of_its_window() -> None:
    # Slow first steps of a fresh engine (before HALF) do not count against it.
    warm_up = readings(T0 + MIN, itl=0.5)
    case = next(c for c in CASES if c.id == "canary-passes-and-the-peers-that-need-it-follow-one-at-a-time")
    samples = dict(case.observed.samples)
    samples[K0] = [*warm_up, *samples[K0]]
    done = run(Case(case.id, case.action, Observed(case.observed.replicas, samples), case.now, plan=case.plan))
    assert done.plan.phase == "rolling" and done.verdict is None


def test_a_step_does_not_change_the_plan_it_was_given() -> None:
    # The plan is the action's stored progress: a step returns a new one, so a failed write loses nothing.
    before = JUDGED.model_dump()
    run(next(c for c in CASES if c.id == "canary-fails-and-gets-its-previous-arguments-back"))
    assert JUDGED.model_dump() == before


@pytest.mark.parametrize(("replica", "generation", "expected"), [
    (None, None, "done"),  # a drained replica no longer reported
    (view(K0, R.STOPPED), None, "done"),
    (view(K0, R.READY), None, "pending"),
    (view(K0, R.DRAINING), None, "pending"),
    (view(K0, R.FATAL), None, "pending"),  # the agent stops a FATAL replica it is told to drain
    (None, 2, "pending"),
    (view(K0, R.READY, 2), 2, "done"),
    (view(K0, R.READY, 3), 2, "done"),  # a later generation counts
    (view(K0, R.READY, 1), 2, "pending"),
    (view(K0, R.READY, 2, ready=False), 2, "pending"),
    (view(K0, R.WARMING, 2), 2, "pending"),
    (view(K0, R.WEDGED, 2, ready=False), 2, "pending"),
    (view(K0, R.FATAL, 2), 2, "fatal"),
], ids=["drain-gone", "drain-stopped", "drain-ready", "drain-draining", "drain-fatal", "gone", "ready-at",
        "ready-later", "ready-older", "not-ready", "warming", "wedged", "fatal"])
def test_progress(replica: ReplicaView | None, generation: int | None, expected: str) -> None:
    assert progress(replica, generation) == expected


@pytest.mark.parametrize(("replica", "expected"), [
    (view(K0, R.FATAL, 1), "pending"),  # reported before the agent took the restart that ends FATAL
    (view(K0, R.FATAL, 2), "fatal"),  # the restart itself ended FATAL
    (view(K0, R.READY, 2), "done"),
])
def test_a_restart_out_of_fatal_is_not_failed_by_the_fatal_it_ends(replica: ReplicaView, expected: str) -> None:
    assert progress(replica, 2, was_fatal=True) == expected


@pytest.mark.parametrize(("payload", "replicas", "expected"), [
    (RollingRestartPayload(), [K0], True),
    (RollingRestartPayload(batch_size=3), [K0, K1], True),
    (LOWER, [K0], True),  # a canary
    (LOWER.model_copy(update={"canary": False}), [K0], False),  # one replica: applied at once
    (LOWER.model_copy(update={"canary": False}), [K0, K1], True),
    (RUNG, [K0], True),
    (RUNG.model_copy(update={"canary": False}), [K0], False),
    (SetFlagsPayload(engine_args={K0: ["--max-num-seqs", "8"]}), [K0, K1], False),  # an operator's list
    (RestartPayload(), [K0, K1], False),
    (DrainPayload(), [K0], False),
], ids=["rolling-one", "rolling-two", "canary", "one-replica", "two-replicas", "rung-canary", "rung-one",
        "set-flags", "restart", "drain"])
def test_is_rollout(payload: RestartPayload | DrainPayload | RolloutPayload, replicas: list[str],
                    expected: bool) -> None:
    assert is_rollout(payload, replicas) is expected
