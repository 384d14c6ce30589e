"""A dark node pages with what it runs, on the control plane's clock, and never for the control plane's own outage."""

from __future__ import annotations

from controlplane.policy.conditions import NodeUnreachableCondition
from controlplane.policy.due import next_due
from controlplane.policy.evaluate import evaluate
from controlplane.policy.payloads import AlertPayload
from controlplane.policy.policy import Policy
from controlplane.policy.snapshot import FleetSnapshot, Node
from controlplane.policy_files import load_directory
from tests.policy.series import at, replica

SHIPPED = {p.name: p for p in load_directory()}["node-unreachable"]


def snapshot(now: float, heard: dict[str, float], reports_since: float | None = None,
             floors: dict[str, int] | None = None) -> FleetSnapshot:
    """Three nodes: llama on a (two replicas), b and c; mistral on a only. ``heard``: each node's last report;
    ``floors``: each model's READY floor (the disruption budget)."""
    replicas = [replica("r0", node="a"), replica("r1", node="a"), replica("m0", node="a", model="mistral"),
                replica("r2", node="b"), replica("r3", node="c")]
    return FleetSnapshot(now=at(now), replicas=replicas,
                         nodes=[Node(name=n, last_report_at=at(t)) for n, t in heard.items()],
                         reports_since=None if reports_since is None else at(reports_since),
                         ready_floors=floors or {})


def test_the_shipped_policy_pages_for_a_node_silent_a_minute() -> None:
    cond = SHIPPED.condition
    assert isinstance(cond, NodeUnreachableCondition) and cond.for_ == 60 and cond.clear_after == 0
    assert SHIPPED.action.kind == "alert" and SHIPPED.action.severity == "page"
    assert SHIPPED.runbook_url == "runbooks/node-unreachable.md"


def test_a_silent_node_pages_with_its_replicas_and_each_models_share_unaccounted_for() -> None:
    heard = {"a": 100.0, "b": 95.0, "c": 158.0}
    early = evaluate([SHIPPED], snapshot(159.9, heard), at(159.9))
    assert [a.target.key for a in early] == ["node:b"]  # a: 59.9 s, not yet
    actions = evaluate([SHIPPED], snapshot(160, heard), at(160))
    [page] = [a for a in actions if a.target.key == "node:a"]
    assert isinstance(page.payload, AlertPayload) and page.payload.severity == "page"
    assert page.policy == "node-unreachable" and page.runbook_url == "runbooks/node-unreachable.md"
    assert page.replicas == []  # nothing is done to them: the page is the whole action
    summary = page.reason
    assert "node a unreachable: no report for 1m" in summary and at(100).isoformat(timespec="seconds") in summary
    # b went silent too: three of llama's four replicas are on silent nodes; mistral's only one.
    assert "llama-8b: r0, r1 here, 3 of its 4 replicas unaccounted for" in summary
    assert "mistral: m0 here, 1 of its 1 replicas unaccounted for" in summary
    [finding] = page.findings
    assert finding.measured["replicas"] == 3 and finding.measured["silent_seconds"] == 60.0
    # Each silent node pages on its own; c, heard 2 s ago, does not.
    assert {a.target.key for a in actions} == {"node:a", "node:b"}


def test_a_control_plane_back_from_its_own_outage_gives_every_node_a_minute_first() -> None:
    heard = {"a": 0.0, "b": 0.0, "c": 0.0}  # the last reports before the control plane went down for 5 minutes
    assert evaluate([SHIPPED], snapshot(330, heard, reports_since=300), at(330)) == []
    late = evaluate([SHIPPED], snapshot(360, heard, reports_since=300), at(360))
    assert {a.target.key for a in late} == {"node:a", "node:b", "node:c"}
    # The silence it reports is the node's own, from its last report.
    assert all("no report for 6m" in a.reason for a in late)


def test_the_round_wakes_when_a_silent_node_is_due() -> None:
    heard = {"a": 100.0, "b": 130.0, "c": 158.0}
    assert next_due([SHIPPED], snapshot(159, heard), at(159)) == at(160)
    # A control plane that started at 150 counts a and b from then: both due at 210, c at 218.
    assert next_due([SHIPPED], snapshot(159, heard, reports_since=150), at(159)) == at(210)


def test_a_node_that_never_reported_and_an_out_of_scope_node_are_not_paged() -> None:
    scoped = Policy.model_validate({**SHIPPED.model_dump(by_alias=True, exclude={"scope"}),
                                    "scope": {"models": ["mistral"]}})
    heard = {"a": 0.0, "b": 0.0, "c": 0.0}
    assert {a.target.key for a in evaluate([scoped], snapshot(100, heard), at(100))} == {"node:a"}
    never = FleetSnapshot(now=at(100), replicas=[replica("r0", node="n")], nodes=[Node(name="n")])
    assert evaluate([SHIPPED], never, at(100)) == []


def test_a_model_left_below_its_budget_by_dark_nodes_is_a_page_of_its_own() -> None:
    floors = {"llama-8b": 2, "mistral": 1}  # the default budget: max(1, ceil(50 % of the replicas))
    # a alone is dark: llama keeps r2 and r3 (2 of 4, its floor); mistral has nothing left.
    actions = evaluate([SHIPPED], snapshot(160, {"a": 100.0, "b": 158.0, "c": 158.0}, floors=floors), at(160))
    assert {a.target.key for a in actions} == {"node:a", "model:mistral"}
    [short] = [a for a in actions if a.target.key == "model:mistral"]
    assert short.model == "mistral" and isinstance(short.payload, AlertPayload) and short.payload.severity == "page"
    assert short.reason == ("model mistral below its disruption budget: 0 of 1 replicas READY on nodes that report, "
                            "budget needs 1; 1 on silent nodes (a: m0)")
    # a and b dark: llama is down to r3, under its floor of 2; one page for the model, whatever the nodes.
    both = evaluate([SHIPPED], snapshot(160, {"a": 100.0, "b": 95.0, "c": 158.0}, floors=floors), at(160))
    [llama] = [a for a in both if a.target.key == "model:llama-8b"]
    assert "1 of 4 replicas READY on nodes that report, budget needs 2; 3 on silent nodes (a: r0, r1; b: r2)" \
        in llama.reason
    # Without a dark node, a model short of READY replicas is not this policy's to page (crash-loop and the
    # SLOs are); and a model without a known budget is never judged.
    assert evaluate([SHIPPED], snapshot(160, {"a": 158.0, "b": 158.0, "c": 158.0}, floors=floors), at(160)) == []
    assert {a.target.key for a in evaluate([SHIPPED], snapshot(160, {"a": 100.0, "b": 158.0, "c": 158.0}),
                                           at(160))} == {"node:a"}
