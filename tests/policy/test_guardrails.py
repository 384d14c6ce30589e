"""Each guardrail on its own, then the batch semantics of decide()."""

from datetime import timedelta

from agent.wire import ReplicaState
from controlplane.policy.guardrails import ActionRecord, BudgetRule, GuardConfig, GuardState, Verdict, decide, record
from controlplane.policy.loader import parse_policies
from controlplane.policy.proposals import ProposedAction, Target
from tests.policy.series import at, fleet, replica

NOW = at(7200)


def policy(name="stall", **guard):
    lines = "".join(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in guard.items())
    text = (f"name: {name}\ncondition: {{detector: stall}}\naction: {{kind: restart}}\n"
            + (f"guardrails:\n{lines}" if lines else ""))
    [p] = parse_policies(text, f"{name}.yaml")
    return p


def restart(name="r1", policy_name="stall", model="llama-8b"):
    return ProposedAction(policy=policy_name, kind="restart", target=Target(kind="replica", node="n1", replica=name),
                          replicas=[f"n1/{name}"], model=model, reason="test")


def alert(name="r1", policy_name="stall"):
    return ProposedAction(policy=policy_name, kind="alert", target=Target(kind="replica", node="n1", replica=name),
                          params={"severity": "page"}, reason="test")


def past(action, minutes_ago, status="succeeded"):
    return ActionRecord(policy=action.policy, kind=action.kind, target=action.target.key,
                        at=NOW - timedelta(minutes=minutes_ago), status=status, replicas=action.replicas,
                        model=action.model, disruptive=action.disruptive)


def four_ready():
    return fleet(7200, [replica(f"r{i}") for i in range(1, 5)])


def one(actions, state=None, policies=None, config=None, snap=None):
    result = decide(actions, state or GuardState(), snap or four_ready(), NOW,
                    policies or {"stall": policy()}, config)
    return result.decisions


def test_unguarded_action_is_allowed():
    [d] = one([restart()])
    assert d.verdict == Verdict.ALLOWED


def test_cooldown_per_policy_and_target():
    p = {"stall": policy(cooldown="15m")}
    state = GuardState(records=[past(restart("r1"), 10)])
    [same, other] = one([restart("r1"), restart("r2")], state, p)
    assert same.verdict == Verdict.SUPPRESSED and same.guardrail == "cooldown"
    assert other.verdict == Verdict.ALLOWED
    [later] = one([restart("r1")], GuardState(records=[past(restart("r1"), 20)]), p)
    assert later.verdict == Verdict.ALLOWED


def test_disruption_budget_keeps_enough_replicas_ready_counting_running_actions():
    config = GuardConfig(budget=BudgetRule(min_ready=1, min_ready_ratio=0.5))  # 4 replicas -> keep 2
    running = GuardState(records=[past(restart("r1", policy_name="other"), 1, status="running")])
    decisions = one([restart("r2"), restart("r3")], running, config=config)
    assert [d.verdict for d in decisions] == [Verdict.ALLOWED, Verdict.SUPPRESSED]
    assert decisions[1].guardrail == "disruption_budget"
    assert "budget needs 2" in decisions[1].reason


def test_a_replica_back_from_a_restart_counts_only_once_it_has_settled():
    # Three replicas, two must serve. r1's restart ended 2 s ago: READY to its agent, but a load balancer puts
    # it back in rotation only after its checks pass (HAProxy: inter x rise). Taking r2 now would leave r3 alone.
    snap = fleet(7200, [replica("r1"), replica("r2"), replica("r3")])
    config = GuardConfig(budget=BudgetRule(min_ready=2, min_ready_ratio=0.0), settle=5)
    ended = past(restart("r1", policy_name="leak"), 0).model_copy(update={"finished_at": NOW - timedelta(seconds=2)})
    [held] = one([restart("r2")], GuardState(records=[ended]), snap=snap, config=config)
    assert held.verdict == Verdict.SUPPRESSED and held.guardrail == "disruption_budget"
    assert "n1/r1 back within the last 5s, not yet counted" in held.reason
    settled = ended.model_copy(update={"finished_at": NOW - timedelta(seconds=5)})
    [d] = one([restart("r2")], GuardState(records=[settled]), snap=snap, config=config)
    assert d.verdict == Verdict.ALLOWED
    # Only an action that ran ends on its replicas: one the guardrails held back leaves nothing settling.
    held_back = ended.model_copy(update={"status": "suppressed"})
    [d] = one([restart("r2")], GuardState(records=[held_back]), snap=snap, config=config)
    assert d.verdict == Verdict.ALLOWED
    # With no settle (a fleet behind no load balancer), back is back.
    [now_ok] = one([restart("r2")], GuardState(records=[ended]), snap=snap, config=config.model_copy(
        update={"settle": 0}))
    assert now_ok.verdict == Verdict.ALLOWED


def test_budget_counts_replicas_that_are_already_down():
    snap = fleet(7200, [replica("r1"), replica("r2", state=ReplicaState.BACKOFF), replica("r3")])
    config = GuardConfig(budget=BudgetRule(min_ready=2, min_ready_ratio=0.0))
    [d] = one([restart("r1")], snap=snap, config=config)
    assert d.verdict == Verdict.SUPPRESSED and d.guardrail == "disruption_budget"


def test_a_wedged_replica_gives_no_capacity_so_restarting_it_is_within_budget():
    from controlplane.policy.detectors.findings import Finding

    wedged = restart("r1").model_copy(update={"findings": [Finding(detector="stall", subject="n1/r1", summary="")]})
    snap = fleet(7200, [replica("r1")])  # the model's only replica
    [d] = one([wedged], snap=snap)
    assert d.verdict == Verdict.ALLOWED


def test_global_rate_limit_on_disruptive_actions():
    config = GuardConfig(max_disruptive_per_window=2, rate_window=3600)
    state = GuardState(records=[past(restart("r9", policy_name="other", model="m2"), 30)])
    decisions = one([restart("r1"), restart("r2"), alert("r3")], state, config=config)
    assert [d.verdict for d in decisions] == [Verdict.ALLOWED, Verdict.SUPPRESSED, Verdict.ALLOWED]
    assert decisions[1].guardrail == "rate_limit"


def test_policy_max_disruptions_per_hour():
    p = {"stall": policy(max_disruptions_per_hour=1, cooldown=0)}
    state = GuardState(records=[past(restart("r1"), 50)])
    [d] = one([restart("r2")], state, p)
    assert d.verdict == Verdict.SUPPRESSED and d.guardrail == "policy_rate_limit"
    [d] = one([restart("r2")], GuardState(records=[past(restart("r1"), 70)]), p)
    assert d.verdict == Verdict.ALLOWED


def test_circuit_breaker_trips_on_failures_and_stops_automation_but_not_pages():
    config = GuardConfig(breaker_max_failures=3)
    failures = [past(restart(f"r{i}", model=f"m{i}"), 5 * i, status="failed") for i in range(1, 4)]
    result = decide([restart("r4"), alert("r4")], GuardState(records=failures), four_ready(), NOW,
                    {"stall": policy()}, config)
    assert result.breaker_trip is not None and "3 failed actions" in result.breaker_trip
    assert [d.verdict for d in result.decisions] == [Verdict.SUPPRESSED, Verdict.ALLOWED]
    assert result.decisions[0].guardrail == "circuit_breaker"


def test_a_tripped_breaker_holds_until_reset():
    tripped = GuardState(breaker_tripped_at=NOW - timedelta(days=2), breaker_reason="too many failures")
    [d] = one([restart()], tripped)
    assert d.verdict == Verdict.SUPPRESSED and "too many failures" in d.reason
    [d] = one([restart()], GuardState())  # reset: the operator cleared breaker_tripped_at
    assert d.verdict == Verdict.ALLOWED


def test_circuit_breaker_trips_on_too_many_disrupted_replicas():
    config = GuardConfig(breaker_max_disrupted_replicas=3)
    records = [past(restart(f"r{i}", model=f"m{i}"), 10 * i) for i in range(1, 4)]
    result = decide([restart("r4")], GuardState(records=records), four_ready(), NOW, {"stall": policy()}, config)
    assert result.breaker_trip and "3 replicas disrupted" in result.breaker_trip


def test_dry_run_policy_is_shadowed_and_consumes_no_budget():
    p = {"stall": policy(dry_run=True), "other": policy("other")}
    config = GuardConfig(max_disruptive_per_window=1)
    decisions = one([restart("r1"), restart("r2", policy_name="other")], policies=p, config=config)
    assert [d.verdict for d in decisions] == [Verdict.SHADOW, Verdict.ALLOWED]
    assert decisions[0].guardrail == "dry_run"


def test_require_approval_leaves_the_action_proposed_and_waiting():
    p = {"stall": policy(require_approval=True)}
    [d] = one([restart()], policies=p)
    assert d.verdict == Verdict.AWAITING_APPROVAL
    assert record(d, NOW).status == "proposed"
    # Waiting for approval also holds the next proposal for the same target (no duplicate requests).
    [again] = one([restart()], GuardState(records=[record(d, NOW - timedelta(minutes=1))]), p)
    assert again.verdict == Verdict.SUPPRESSED and again.guardrail == "cooldown"


def test_an_operators_restart_of_a_wedged_only_replica_is_within_budget():
    # The agent took it out of rotation (WEDGED): it serves nothing, so a restart takes no capacity away,
    # with or without a stall finding behind it.
    snap = fleet(7200, [replica("r1", state=ReplicaState.WEDGED)])
    [d] = one([restart("r1", policy_name="operator")], snap=snap, policies={"operator": policy("operator")})
    assert d.verdict == Verdict.ALLOWED
