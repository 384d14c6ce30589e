"""The ``alert:`` condition: Alertmanager's alerts, mapped to a replica, node or model, drive a policy's action."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.policy.conditions import AlertCondition
from controlplane.policy.evaluate import evaluate
from controlplane.policy.guardrails import GuardConfig, GuardState, Verdict, decide
from controlplane.policy.loader import PolicyLoadError, parse_policies
from controlplane.policy.policy import Policy
from controlplane.policy.snapshot import ExternalAlert, FleetSnapshot
from controlplane.policy_files import load_files
from tests.policy.series import at, fleet, healthy, replica

RESTART_ON_TTFT = """\
name: ttft-alert
description: the team's TTFTHigh rule restarts the replica it fires on
condition: {alert: TTFTHigh, for: 1m}
action: {kind: restart}
"""


def one(text: str):
    [policy] = parse_policies(text, "policy.yaml")
    return policy


def alert(name: str, target: str, started: float, **labels: str) -> ExternalAlert:
    return ExternalAlert(alertname=name, target=target, starts_at=at(started), fingerprint=f"fp-{name}-{target}",
                         labels={"alertname": name, **labels}, severity="critical", summary=f"{name} on {target}")


def with_alerts(*alerts: ExternalAlert) -> FleetSnapshot:
    replicas = [replica("r1", node="n1", history=healthy(600)), replica("r2", node="n1", gpus=[1],
                                                                         history=healthy(600)),
                replica("q1", node="n2", model="qwen-7b", history=healthy(600))]
    return fleet(600, replicas).model_copy(update={"external_alerts": list(alerts)})


def proposals(policy_text: str, snap: FleetSnapshot, now: float) -> list[tuple[str, str]]:
    return sorted((a.kind, a.target.key) for a in evaluate([one(policy_text)], snap, at(now)))


def test_proposes_the_action_on_the_mapped_replica_once_the_alert_fired_for_a_minute() -> None:
    snap = with_alerts(alert("TTFTHigh", "replica:n1/r1", started=500))
    assert proposals(RESTART_ON_TTFT, snap, 530) == []
    assert proposals(RESTART_ON_TTFT, snap, 559.9) == []
    [action] = evaluate([one(RESTART_ON_TTFT)], snap, at(560))
    assert (action.kind, action.target.key, action.replicas) == ("restart", "replica:n1/r1", ["n1/r1"])
    finding = action.findings[0]
    assert finding.detector == "alert" and finding.measured["alertname"] == "TTFTHigh"
    assert "TTFTHigh" in action.reason and "1m" in action.reason and "TTFTHigh on replica:n1/r1" in action.reason
    assert finding.evidence[0].values["fingerprint"] == "fp-TTFTHigh-replica:n1/r1"


def test_another_alertname_or_an_unmapped_alert_proposes_nothing() -> None:
    snap = with_alerts(alert("ErrorsHigh", "replica:n1/r1", started=0), alert("TTFTHigh", "unmapped", started=0),
                       alert("TTFTHigh", "replica:n9/gone", started=0))
    assert proposals(RESTART_ON_TTFT, snap, 600) == []


def test_the_guardrails_still_hold_the_action() -> None:
    policy = one(RESTART_ON_TTFT.replace("action: {kind: restart}",
                                         "action: {kind: restart}\nguardrails: {require_approval: true}"))
    snap = with_alerts(alert("TTFTHigh", "replica:n1/r1", started=0))
    result = decide(evaluate([policy], snap, at(600)), GuardState(), snap, at(600), {policy.name: policy},
                    GuardConfig())
    [decision] = result.decisions
    assert decision.verdict is Verdict.AWAITING_APPROVAL


def test_without_for_it_holds_as_soon_as_the_alert_fires() -> None:
    text = "name: now\ncondition: {detector: alert, alertname: TTFTHigh}\naction: {kind: alert, severity: page}\n"
    snap = with_alerts(alert("TTFTHigh", "replica:n1/r2", started=600))
    assert proposals(text, snap, 600) == [("alert", "replica:n1/r2")]


def test_a_node_alert_cordons_the_node_and_a_model_alert_rolls_the_model() -> None:
    snap = with_alerts(alert("NodeDiskFull", "node:n2", started=0), alert("KVCacheFull", "model:llama-8b", started=0))
    cordon = "name: disk\ncondition: {alert: NodeDiskFull}\naction: {kind: cordon}\n"
    assert proposals(cordon, snap, 600) == [("cordon", "node:n2")]
    rolling = "name: kv\ncondition: {alert: KVCacheFull}\naction: {kind: rolling_restart}\n"
    [roll] = evaluate([one(rolling)], snap, at(600))
    assert roll.target.key == "model:llama-8b" and sorted(roll.replicas) == ["n1/r1", "n1/r2"]
    # A node alert restarts the replicas on that node; a cordon has no node to fence for a model.
    restart = "name: disk-restart\ncondition: {alert: NodeDiskFull}\naction: {kind: restart}\n"
    assert proposals(restart, snap, 600) == [("restart", "replica:n2/q1")]
    assert proposals("name: kv-cordon\ncondition: {alert: KVCacheFull}\naction: {kind: cordon}\n", snap, 600) == []


def test_scope_limits_the_targets() -> None:
    snap = with_alerts(alert("TTFTHigh", "replica:n1/r1", started=0), alert("TTFTHigh", "replica:n2/q1", started=0),
                       alert("TTFTHigh", "node:n1", started=0))
    scoped = RESTART_ON_TTFT + "scope: {models: ['qwen-*']}\n"
    assert proposals(scoped, snap, 600) == [("restart", "replica:n2/q1")]


def test_several_alerts_of_the_name_on_one_target_make_one_finding() -> None:
    snap = with_alerts(alert("GpuHot", "node:n1", started=100, gpu="0"), alert("GpuHot", "node:n1", started=0, gpu="1"))
    [action] = evaluate([one("name: hot\ncondition: {alert: GpuHot}\naction: {kind: alert}\n")], snap, at(600))
    assert action.target.key == "node:n1" and action.findings[0].measured["alerts"] == 2
    assert action.findings[0].measured["firing_seconds"] == 600


def test_loads_from_yaml_in_both_spellings() -> None:
    shorthand = one(RESTART_ON_TTFT).condition
    spelled = one("name: x\ncondition: {detector: alert, alertname: TTFTHigh, for: 60s}\n"
                  "action: {kind: restart}\n").condition
    assert shorthand == spelled == AlertCondition(alertname="TTFTHigh", for_=60.0)
    assert shorthand.clear_after == 60.0
    # As the API serves it (GET /v1/policies), and read back.
    policy = one(RESTART_ON_TTFT)
    served = policy.model_dump(mode="json", by_alias=True)
    assert served["condition"] == {"detector": "alert", "alertname": "TTFTHigh", "for": 60.0}
    assert Policy.model_validate(served) == policy
    assert one("name: y\ncondition: {alert: TTFTHigh}\naction: {kind: restart}\n").condition.clear_after == 0.0


@pytest.mark.parametrize(("text", "line", "field", "needle"), [
    ("name: a\ncondition:\n  alert: TTFTHigh\n  for: soon\naction: {kind: restart}\n", 4, "condition.for",
     "invalid duration"),
    ("name: a\ncondition:\n  detector: alert\n  alertname: TTFTHigh\n  window: 5m\naction: {kind: restart}\n", 5,
     "condition.window", "Extra inputs"),
    ("name: a\ncondition:\n  detector: alert\naction: {kind: restart}\n", 3, "condition.alertname", "required"),
    ("name: a\ncondition:\n  alert: [TTFTHigh]\naction: {kind: restart}\n", 3, "condition.alert", "valid string"),
    # Both spellings at once: the shorthand's key is the one too many.
    ("name: a\ncondition:\n  alert: TTFTHigh\n  alertname: Other\naction: {kind: restart}\n", 3,
     "condition.alert", "Extra inputs"),
])
def test_a_bad_field_is_named_with_its_file_and_line(tmp_path: Path, text: str, line: int, field: str,
                                                    needle: str) -> None:
    path = tmp_path / "alert-policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyLoadError) as info:
        load_files([path])
    [error] = info.value.errors
    assert (error.file, error.line, error.field) == (str(path), line, field)
    assert needle in error.message


def test_an_old_snapshot_without_external_alerts_still_loads() -> None:
    data = fleet(10, [replica()]).model_dump(mode="json")
    data.pop("external_alerts")
    assert FleetSnapshot.model_validate(data).external_alerts == []
