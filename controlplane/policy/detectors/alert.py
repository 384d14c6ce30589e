"""Alertmanager's alerts as findings: a team's own Prometheus rules decide *when*, Pitstop's policy *what*.

The alerts reach the snapshot already mapped to a target (``replica:node/name``, ``node:name``,
``model:name``) by the control plane when Alertmanager posted them; an unmapped alert has no subject to act on
and never becomes a finding. One finding per target, however many alerts of the name fire on it (a rule over
each GPU of a node fires once per GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from controlplane.policy.conditions import AlertCondition
from controlplane.policy.detectors.findings import Evidence, Finding, thin
from controlplane.policy.durations import format_duration
from controlplane.policy.snapshot import UNMAPPED, ExternalAlert

DETECTOR = "alert"


def _describe(target: str) -> str:
    kind, _, name = target.partition(":")
    return f"{kind} {name}" if name else target


def detect_alert(cond: AlertCondition, alerts: Sequence[ExternalAlert], in_scope: Callable[[str], bool],
                 now: datetime) -> list[Finding]:
    """A finding per in-scope target on which an alert named ``cond.alertname`` has fired for ``cond.for_``.

    ``in_scope`` says whether the policy's scope covers a target key. The age is counted from the alert's
    ``startsAt``: a rule's own ``for`` has already passed by then, and a restart of the control plane does not
    restart the count.
    """
    held = float(cond.for_ or 0.0)
    by_target: dict[str, list[ExternalAlert]] = {}
    for alert in alerts:
        if alert.alertname != cond.alertname or alert.target == UNMAPPED:
            continue
        if (now - alert.starts_at).total_seconds() < held:
            continue
        by_target.setdefault(alert.target, []).append(alert)
    findings = []
    for target in sorted(by_target):
        if not in_scope(target):
            continue
        firing = sorted(by_target[target], key=lambda a: a.starts_at)
        first = firing[0]
        age = max(0.0, (now - first.starts_at).total_seconds())
        summary = next((a.summary for a in firing if a.summary), "")
        findings.append(Finding(
            detector=DETECTOR,
            subject=target,
            summary=f"Alertmanager alert {cond.alertname} firing on {_describe(target)} for "
                    f"{format_duration(age)}" + (f": {summary[:200]}" if summary else ""),
            measured={"alertname": cond.alertname, "target": target, "alerts": len(firing),
                      "firing_seconds": round(age, 3), "severity": first.severity or None},
            evidence=thin([Evidence(at=a.starts_at, values={
                "alertname": a.alertname, "fingerprint": a.fingerprint, "severity": a.severity or None,
                "summary": a.summary or None, "labels": [f"{k}={v}" for k, v in sorted(a.labels.items())]})
                for a in firing]),
        ))
    return findings
