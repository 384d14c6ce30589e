"""The Policies page as data: what each loaded policy watches, its mode, and what it would do now. Pure.

``GET /v1/policies`` gives the policies as loaded; ``GET /v1/policies/explain`` runs them on the live fleet as a
dry run (with the guardrails' decisions), so on-call sees what Pitstop is about to do before it does it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.console.shaping import Json


def mode(policy: Json) -> str:
    """active, dry run, approval (a person approves each action) or disabled."""
    guard: Json = policy.get("guardrails") or {}
    if not policy.get("enabled", True):
        return "disabled"
    if guard.get("dry_run"):
        return "dry run"
    return "approval" if guard.get("require_approval") else "active"


def _target(target: Json) -> str:
    kind = target.get("kind")
    if kind == "replica":
        return f"replica:{target.get('node')}/{target.get('replica')}"
    if kind == "gpu":
        return f"gpu:{target.get('node')}/{target.get('gpu')}"
    return f"{kind}:{target.get('model') or target.get('node')}"


def decision_line(decision: Json) -> str:
    action: Json = decision.get("action") or {}
    line = f"{action.get('kind')} {_target(action.get('target') or {})}: {decision.get('verdict')}"
    if decision.get("guardrail"):
        line += f" by {decision['guardrail']}"
    if decision.get("reason"):
        line += f" ({decision['reason']})"
    if action.get("reason"):
        line += f" because {action['reason']}"
    return line


def policy_rows(policies: Sequence[Json], explained: Json) -> list[dict[str, Any]]:
    """One row per policy: its mode, what it watches and does, and what explain says it would do now."""
    reports = {r.get("name"): r for r in explained.get("policies") or []}
    rows = []
    for p in policies:
        report: Json = reports.get(p.get("name"), {})
        condition: Json = p.get("condition") or {}
        watches = condition.get("signal") or condition.get("detector") or ""
        rows.append({"policy": p.get("name"), "mode": mode(p), "watches": str(watches),
                     "does": (p.get("action") or {}).get("kind"), "now": report.get("status", ""),
                     "would": "; ".join(decision_line(d) for d in report.get("decisions") or [])})
    return rows


def breaker_note(explained: Json) -> str | None:
    if explained.get("breaker_trips_now"):
        return f"The circuit breaker would trip now: {explained.get('breaker')}"
    if explained.get("breaker"):
        return f"Circuit breaker: {explained['breaker']}"
    return None


def error_rows(listed: Json) -> list[dict[str, Any]]:
    return [{"file": e.get("file"), "line": e.get("line"), "field": e.get("field"), "error": e.get("message")}
            for e in listed.get("errors") or []]
