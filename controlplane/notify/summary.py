"""What Pitstop already did about an alert, in one line for the person it pages. Pure.

The line comes from the latest action the same policy took on the same target since the alert began (a
restart, a canary, a cordon), or says why it held back (the guardrail's reason), so on-call reads "restart of
gpu-a/r2 succeeded at 03:12Z: every replica converged" or "holding: disruption budget: llama-8b: 1 of 3
replicas would stay READY" before opening anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.policy.lifecycle import ActionState


@dataclass(frozen=True)
class ActionFacts:
    """The parts of an action record the line is made of."""

    kind: str
    target: str
    state: ActionState
    created_at: datetime
    finished_at: datetime | None = None
    outcome: str = ""
    guardrail: str | None = None
    guardrail_reason: str = ""


def _at(moment: datetime) -> str:
    return moment.strftime("%H:%M:%SZ")


def describe(action: ActionFacts | None) -> str:
    """The line for ``action`` (None: Pitstop only alerted)."""
    if action is None:
        return "no automatic action: alert only"
    what = f"{action.kind.replace('_', ' ')} of {action.target.partition(':')[2] or action.target}"
    s = ActionState
    if action.state in (s.SUCCEEDED, s.FAILED, s.ROLLED_BACK):
        when = _at(action.finished_at or action.created_at)
        done = {s.SUCCEEDED: "succeeded", s.FAILED: "failed", s.ROLLED_BACK: "rolled back"}[action.state]
        return f"{what} {done} at {when}" + (f": {action.outcome}" if action.outcome else "")
    if action.state in (s.APPROVED, s.RUNNING):
        return f"{what} in progress since {_at(action.created_at)}"
    if action.state is s.PROPOSED:
        return f"{what} proposed at {_at(action.created_at)}, waiting for an operator's approval"
    if action.state is s.SHADOW:
        return f"dry run: would {what}"
    if action.state is s.SUPPRESSED:
        return f"holding: {action.guardrail or 'a guardrail'}: {action.guardrail_reason}".rstrip(": ")
    return f"{what} {action.state.value} at {_at(action.finished_at or action.created_at)}"
