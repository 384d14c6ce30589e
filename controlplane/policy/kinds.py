"""The table of action kinds: for each, what it does to serving, which guardrails judge it, who may ask for it,
how the executor applies it, and its payload model.

Guardrails, the operator API, the executor and the round all read this table; no kind is passed off as another
(an operator's drain is a drain to the disruption budget, an uncordon is an uncordon). See docs/design.md,
"The action contract".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from controlplane.policy import payloads
from controlplane.security.roles import Role


class ActionKind(StrEnum):
    RESTART = "restart"
    PLANNED_RESTART = "planned_restart"
    DRAIN = "drain"
    ROLLING_RESTART = "rolling_restart"
    SET_FLAGS = "set_flags"
    LOWER_MAX_NUM_SEQS = "lower_max_num_seqs"
    RAISE_MAX_NUM_SEQS = "raise_max_num_seqs"
    ADD_ENGINE_FLAG = "add_engine_flag"
    SET_LIVE_CAP = "set_live_cap"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    ALERT = "alert"


class Guardrail(StrEnum):
    CIRCUIT_BREAKER = "circuit_breaker"
    COOLDOWN = "cooldown"
    POLICY_RATE_LIMIT = "policy_rate_limit"
    RATE_LIMIT = "rate_limit"
    DISRUPTION_BUDGET = "disruption_budget"


# How the executor applies a kind: replicas' desired state, a rollout (batches, canaries), the node's fences,
# or an alert record.
Apply = Literal["desired", "rollout", "node", "alert"]
# Who may ask: the policies (automatic), and operators through the API with at least ``operator_role``.
_EVERY_GUARD = frozenset(Guardrail)
_CAPACITY_GUARDS = _EVERY_GUARD - {Guardrail.DISRUPTION_BUDGET}
_ONLY_COOLDOWN = frozenset({Guardrail.COOLDOWN})


@dataclass(frozen=True)
class KindSpec:
    payload: type[payloads._Payload]
    # Takes capacity away: counts for rate limits and the breaker, and waits for approval where required.
    disrupts: bool
    # Stops replicas of a model: counts against its disruption budget.
    stops_replicas: bool
    guardrails: frozenset[Guardrail]
    by_policy: bool
    operator_role: Role | None
    apply: Apply
    # Applied through an agent (its desired state or its fences), so it converges only when the agent reports.
    needs_agent: bool
    # The governor's ``--max-num-seqs`` ladder and its flag rungs: one change of a model in flight at a time.
    governed: bool = False


KINDS: dict[ActionKind, KindSpec] = {
    ActionKind.RESTART: KindSpec(payloads.RestartPayload, True, True, _EVERY_GUARD, True, Role.OPERATOR,
                                 "desired", True),
    ActionKind.PLANNED_RESTART: KindSpec(payloads.PlannedRestartPayload, True, True, _EVERY_GUARD, True, None,
                                         "desired", True),
    ActionKind.DRAIN: KindSpec(payloads.DrainPayload, True, True, _EVERY_GUARD, False, Role.OPERATOR,
                               "desired", True),
    ActionKind.ROLLING_RESTART: KindSpec(payloads.RollingRestartPayload, True, True, _EVERY_GUARD, True,
                                         Role.OPERATOR, "rollout", True),
    ActionKind.SET_FLAGS: KindSpec(payloads.SetFlagsPayload, True, True, _EVERY_GUARD, False, Role.OPERATOR,
                                   "desired", True),
    # Operators set a model's --max-num-seqs through POST /v1/models/{model}/actions (set_max_num_seqs): a
    # canary, judged and rolled as the governor's own.
    ActionKind.LOWER_MAX_NUM_SEQS: KindSpec(payloads.MaxNumSeqsPayload, True, True, _EVERY_GUARD, True,
                                            Role.OPERATOR, "rollout", True, governed=True),
    ActionKind.RAISE_MAX_NUM_SEQS: KindSpec(payloads.MaxNumSeqsPayload, True, True, _EVERY_GUARD, True,
                                            Role.OPERATOR, "rollout", True, governed=True),
    ActionKind.ADD_ENGINE_FLAG: KindSpec(payloads.AddEngineFlagPayload, True, True, _EVERY_GUARD, True, None,
                                         "rollout", True, governed=True),
    # A live cap takes no replica out of rotation (no restart, no drain): every guardrail but the budget, and
    # one change of a model's concurrency at a time, as the governor's restarts are.
    ActionKind.SET_LIVE_CAP: KindSpec(payloads.SetLiveCapPayload, True, False, _CAPACITY_GUARDS, True,
                                      Role.OPERATOR, "desired", True, governed=True),
    # A cordon fences capacity but stops nothing at once (the agent drains the fenced replicas): no budget.
    ActionKind.CORDON: KindSpec(payloads.CordonPayload, True, False, _CAPACITY_GUARDS, True, Role.OPERATOR,
                                "node", True),
    # Giving capacity back is never held back by a capacity guardrail; policies never uncordon.
    ActionKind.UNCORDON: KindSpec(payloads.CordonPayload, False, False, _ONLY_COOLDOWN, False, Role.OPERATOR,
                                  "node", True),
    # The page must go out even when automation is stopped.
    ActionKind.ALERT: KindSpec(payloads.AlertPayload, False, False, _ONLY_COOLDOWN, True, None, "alert", False),
}


def spec(kind: str) -> KindSpec:
    """The table's row for ``kind``; a ValueError names a kind the contract does not know."""
    return KINDS[ActionKind(kind)]


def find(kind: str) -> KindSpec | None:
    """The table's row for ``kind``, or None for a kind it does not know (a stored row of an older one)."""
    try:
        return spec(kind)
    except ValueError:
        return None
