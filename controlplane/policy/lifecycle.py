"""Action states: the allowed transitions, who owns each arrow, and the guard every change goes through.

Modelled on ``agent/states.py``. Every change of an action's state is checked against ``ALLOWED`` before it
is written, and recorded (time, from, to, by whom, why) in the action's trail. See docs/design.md, "The
action contract".

    (new) ──guardrails──> proposed | approved | suppressed | shadow
    proposed ──operator──> approved | rejected        proposed ──executor──> expired
    approved ──executor──> running                    running ──executor──> succeeded | failed | rolled_back

An alert the control plane raises on its own (the circuit breaker's page) is recorded ``succeeded`` at once.
"""

from __future__ import annotations

from enum import StrEnum


class ActionState(StrEnum):
    PROPOSED = "proposed"
    APPROVED = "approved"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    SUPPRESSED = "suppressed"
    SHADOW = "shadow"
    REJECTED = "rejected"
    EXPIRED = "expired"


S = ActionState

# The states an action may be created in (the guardrails' verdicts, and the breaker's own page).
INITIAL: frozenset[ActionState] = frozenset({S.PROPOSED, S.APPROVED, S.SUPPRESSED, S.SHADOW, S.SUCCEEDED})
FINAL: frozenset[ActionState] = frozenset(
    {S.SUCCEEDED, S.FAILED, S.ROLLED_BACK, S.SUPPRESSED, S.SHADOW, S.REJECTED, S.EXPIRED})
# Still to be decided, applied or judged: a new proposal for the same thing waits for these.
OPEN: frozenset[ActionState] = frozenset({S.PROPOSED, S.APPROVED, S.RUNNING})

ALLOWED: dict[ActionState, frozenset[ActionState]] = {
    S.PROPOSED: frozenset({S.APPROVED, S.REJECTED, S.EXPIRED}),
    S.APPROVED: frozenset({S.RUNNING}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.ROLLED_BACK}),
    **{state: frozenset() for state in FINAL},
}

# Who owns each arrow (for the trail and for readers): the operator decides proposals, the executor the rest.
OWNER: dict[tuple[ActionState, ActionState], str] = {
    (S.PROPOSED, S.APPROVED): "operator",
    (S.PROPOSED, S.REJECTED): "operator",
    (S.PROPOSED, S.EXPIRED): "executor",
    (S.APPROVED, S.RUNNING): "executor",
    (S.RUNNING, S.SUCCEEDED): "executor",
    (S.RUNNING, S.FAILED): "executor",
    (S.RUNNING, S.ROLLED_BACK): "executor",
}


class IllegalTransition(ValueError):
    """A change the table does not allow: a bug in the caller, refused before anything is written."""


def check_transition(src: ActionState | None, dst: ActionState) -> None:
    """Raise ``IllegalTransition`` unless ``src -> dst`` is allowed (``src`` None: the action is created)."""
    if src is None:
        if dst not in INITIAL:
            raise IllegalTransition(f"an action cannot be created {dst.value}")
        return
    if dst not in ALLOWED[src]:
        raise IllegalTransition(f"an action cannot go from {src.value} to {dst.value}")
