"""``explain``: what each policy would do now and what the guardrails say, for the CLI and the API."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.policy.evaluate import evaluate
from controlplane.policy.guardrails import Decision, GuardConfig, GuardState, Verdict, breaker_check, decide
from controlplane.policy.policy import Policy
from controlplane.policy.snapshot import FleetSnapshot


class PolicyReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    runbook_url: str | None = None
    status: Literal["disabled", "quiet", "acting"]
    dry_run: bool = False
    decisions: list[Decision] = Field(default_factory=list)


class ExplainReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    now: datetime
    breaker: str | None = None
    breaker_trips_now: bool = False
    policies: list[PolicyReport]

    @property
    def decisions(self) -> list[Decision]:
        return [d for p in self.policies for d in p.decisions]


def explain(policies: Sequence[Policy], snapshot: FleetSnapshot, guard_state: GuardState, now: datetime,
            config: GuardConfig | None = None) -> ExplainReport:
    """Evaluate every policy and run the guardrails over the result, grouped by policy. Pure."""
    config = config or GuardConfig()
    result = decide(evaluate(policies, snapshot, now), guard_state, snapshot, now,
                    {p.name: p for p in policies}, config)
    reports = []
    for policy in policies:
        mine = [d for d in result.decisions if d.action.policy == policy.name]
        status: Literal["disabled", "quiet", "acting"] = (
            "disabled" if not policy.enabled else "acting" if mine else "quiet")
        reports.append(PolicyReport(name=policy.name, description=policy.description,
                                    runbook_url=policy.runbook_url, status=status,
                                    dry_run=policy.guardrails.dry_run, decisions=mine))
    return ExplainReport(now=now, breaker=breaker_check(guard_state, config, now),
                         breaker_trips_now=result.breaker_trip is not None, policies=reports)


_MARK = {Verdict.ALLOWED: "ALLOW", Verdict.SUPPRESSED: "HOLD", Verdict.SHADOW: "SHADOW",
         Verdict.AWAITING_APPROVAL: "APPROVE?"}


def render_text(report: ExplainReport, evidence: bool = True) -> str:
    """A terminal rendering: one block per policy, one line per decision, evidence indented below."""
    lines = [f"policy evaluation at {report.now.isoformat()}"]
    if report.breaker:
        lines.append(f"CIRCUIT BREAKER {'TRIPS NOW' if report.breaker_trips_now else 'OPEN'}: {report.breaker}; "
                     "disruptive actions are held until an operator resets it")
    for p in report.policies:
        lines.append("")
        lines.append(f"{p.name}: {p.status}{' (dry-run)' if p.dry_run else ''}"
                     + (f" — {p.description}" if p.description else ""))
        for d in p.decisions:
            a = d.action
            params = ", ".join(f"{k}={v}" for k, v in a.params.items() if k != "engine_args")
            lines.append(f"  [{_MARK[d.verdict]}] {a.kind} {a.target.key}" + (f" ({params})" if params else ""))
            lines.append(f"      why: {a.reason}")
            if d.verdict != Verdict.ALLOWED:
                lines.append(f"      guardrail {d.guardrail}: {d.reason}")
            if evidence:
                for f in a.findings:
                    for point in f.evidence[-3:]:
                        values = ", ".join(f"{k}={v}" for k, v in point.values.items())
                        lines.append(f"      evidence {point.at.isoformat()}: {values}")
            if a.runbook_url:
                lines.append(f"      runbook: {a.runbook_url}")
    return "\n".join(lines)
