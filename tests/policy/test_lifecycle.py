"""The action state table: every (from, to) pair is allowed exactly when the table says so, and nothing leaves
a final state. One case per pair, so a changed arrow shows up as the one pair it changed."""

from __future__ import annotations

from itertools import product

import pytest

from controlplane.policy.lifecycle import (
    ALLOWED,
    FINAL,
    INITIAL,
    OPEN,
    OWNER,
    ActionState,
    IllegalTransition,
    check_transition,
)

S = ActionState
PAIRS = list(product(ActionState, ActionState))
ALLOWED_PAIRS = [(a, b) for a, b in PAIRS if b in ALLOWED[a]]
REFUSED_PAIRS = [(a, b) for a, b in PAIRS if b not in ALLOWED[a]]


def test_every_state_has_a_row() -> None:
    assert set(ALLOWED) == set(ActionState)


def test_the_table_is_the_documented_one() -> None:
    # The lifecycle a reader of docs/design.md expects; a new arrow must be added here on purpose.
    assert set(ALLOWED_PAIRS) == {
        (S.PROPOSED, S.APPROVED), (S.PROPOSED, S.REJECTED), (S.PROPOSED, S.EXPIRED),
        (S.APPROVED, S.RUNNING),
        (S.RUNNING, S.SUCCEEDED), (S.RUNNING, S.FAILED), (S.RUNNING, S.ROLLED_BACK),
    }


@pytest.mark.parametrize(("src", "dst"), ALLOWED_PAIRS, ids=lambda s: s.value)
def test_allowed_pair_passes_the_guard(src: ActionState, dst: ActionState) -> None:
    check_transition(src, dst)


@pytest.mark.parametrize(("src", "dst"), REFUSED_PAIRS, ids=lambda s: s.value)
def test_refused_pair_raises_naming_both_states(src: ActionState, dst: ActionState) -> None:
    with pytest.raises(IllegalTransition) as refused:
        check_transition(src, dst)
    # The message is what a caller logs: it must say which move was refused.
    assert f"from {src.value} to {dst.value}" in str(refused.value)
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize("dst", list(ActionState), ids=lambda s: s.value)
def test_creation_is_allowed_exactly_in_the_initial_states(dst: ActionState) -> None:
    if dst in INITIAL:
        check_transition(None, dst)
        return
    with pytest.raises(IllegalTransition, match=f"created {dst.value}"):
        check_transition(None, dst)


def test_the_initial_states_are_the_guardrails_verdicts_and_the_breakers_page() -> None:
    # running / failed / rolled_back / rejected / expired only ever follow an earlier state.
    assert {S.PROPOSED, S.APPROVED, S.SUPPRESSED, S.SHADOW, S.SUCCEEDED} == INITIAL


@pytest.mark.parametrize("src", sorted(FINAL), ids=lambda s: s.value)
def test_a_final_state_has_no_way_out(src: ActionState) -> None:
    assert ALLOWED[src] == frozenset()
    for dst in ActionState:
        with pytest.raises(IllegalTransition):
            check_transition(src, dst)


def test_open_and_final_split_the_states() -> None:
    # An open action is still to be decided, applied or judged: exactly the states with a way out.
    assert OPEN.isdisjoint(FINAL)
    assert set(ActionState) == OPEN | FINAL
    assert {s for s in ActionState if ALLOWED[s]} == OPEN


def test_every_arrow_has_an_owner_and_only_arrows_do() -> None:
    assert set(OWNER) == set(ALLOWED_PAIRS)
    assert {dst for (src, dst), who in OWNER.items() if who == "operator"} == {S.APPROVED, S.REJECTED}
    assert all(who == "executor" for (src, _), who in OWNER.items() if src is not S.PROPOSED)


def test_every_state_is_reachable_from_creation() -> None:
    reached = set(INITIAL)
    frontier = list(INITIAL)
    while frontier:
        for dst in ALLOWED[frontier.pop()]:
            if dst not in reached:
                reached.add(dst)
                frontier.append(dst)
    assert reached == set(ActionState)
