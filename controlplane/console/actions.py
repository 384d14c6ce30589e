"""The console's Actions section, as data: API reads and writes, and API JSON -> rows and lines. No Streamlit.

Shows why Pitstop did, or did not, do something: each action's state, policy, target, reason, the guardrails'
verdicts and the evidence behind them; the proposals waiting for an operator; the circuit breaker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from controlplane.console.client import ApiUnavailable, _get
from controlplane.console.shaping import Json
from controlplane.policy.payloads import Captured, RolloutPlan

EVIDENCE_POINTS = 5


@dataclass(frozen=True)
class ActionsView:
    actions: list[dict[str, Any]] = field(default_factory=list)
    proposed: list[dict[str, Any]] = field(default_factory=list)
    breaker: dict[str, Any] = field(default_factory=dict)


def fetch_actions(client: httpx.Client, *, limit: int = 100) -> ActionsView:
    """Recent actions, the proposals awaiting approval and the breaker, read in three requests."""
    return ActionsView(actions=_get(client, "/v1/actions", {"limit": limit}),
                       proposed=_get(client, "/v1/actions", {"state": "proposed", "limit": limit}),
                       breaker=_get(client, "/v1/remediation/breaker"))


def decide(client: httpx.Client, action_id: int, *, approve: bool) -> str:
    """Approve or reject a proposed action with the console's token; a line for the page either way."""
    verb = "approve" if approve else "reject"
    try:
        response = client.post(f"/v1/actions/{action_id}/{verb}")
    except httpx.HTTPError as exc:
        raise ApiUnavailable(f"cannot reach the control plane to {verb} action {action_id}: {exc}") from exc
    if response.status_code in (401, 403):
        return f"the console's token may not {verb} actions (HTTP {response.status_code}): it needs an operator token"
    if response.status_code == 409:
        return f"action {action_id} is no longer waiting for approval"
    if response.status_code != 200:
        return f"{verb} failed: HTTP {response.status_code}"
    return f"action {action_id}: {response.json()['state']}"


def _verdicts(action: Json) -> str:
    parts = []
    for g in action.get("guardrails") or []:
        text = str(g.get("verdict", ""))
        if g.get("guardrail"):
            text += f" by {g['guardrail']}"
        if g.get("reason"):
            text += f": {g['reason']}"
        parts.append(text)
    return "; ".join(parts)


def action_rows(actions: Sequence[Json]) -> list[dict[str, Any]]:
    """One row per action, newest first, with the columns an on-call reads first."""
    return [{
        "id": a["id"], "created": a.get("created_at"), "state": a["state"], "policy": a.get("policy") or "operator",
        "kind": a["kind"], "target": a["target"], "by": a.get("approved_by") or a.get("requested_by"),
        "outcome": a.get("outcome", ""), "reason": a.get("reason", ""), "guardrails": _verdicts(a),
    } for a in actions]


def evidence_lines(action: Json, points: int = EVIDENCE_POINTS) -> list[str]:
    """The findings behind an action and their last few samples, as text lines."""
    lines: list[str] = []
    for finding in action.get("evidence") or []:
        lines.append(f"{finding.get('detector')} on {finding.get('subject')}: {finding.get('summary')}")
        measured = {k: v for k, v in (finding.get("measured") or {}).items() if v is not None}
        if measured:
            lines.append("  measured: " + ", ".join(f"{k}={v}" for k, v in measured.items()))
        for point in (finding.get("evidence") or [])[-points:]:
            values = ", ".join(f"{k}={v}" for k, v in (point.get("values") or {}).items())
            lines.append(f"  {point.get('at')}: {values}")
    rollout = _progress(action).rollout
    if rollout is not None and rollout.canary_verdict is not None:
        verdict = rollout.canary_verdict
        lines.append(f"canary: {verdict.verdict}: {verdict.reason}")
        figures = verdict.figures
        compared = [f"{key.removeprefix('canary_')} {mine:.4g} vs {theirs:.4g}" for key, mine in figures.items()
                    if key.startswith("canary_") and mine is not None
                    and (theirs := figures.get("peers_" + key.removeprefix("canary_"))) is not None]
        if compared:
            lines.append("  canary vs baseline: " + "; ".join(compared))
    if rollout is not None and rollout.baseline:
        baseline = rollout.baseline
        lines.append("  judged against: " + (", ".join(baseline) if isinstance(baseline, list) else str(baseline)))
    if rollout is not None and rollout.waiting:
        lines.append(f"rollout {rollout.waiting}")
    return lines


def captured_lines(action: Json) -> list[str]:
    """What a restart kept of the engine it replaced: per replica, the stack dump's note and the dump itself."""
    lines: list[str] = []
    for key, entry in (_progress(action).captured or {}).items():
        lines.append(f"{key}: {entry.stack_dump_note or 'no stack dump recorded'}")
        if entry.stack_dump:
            lines += ["", entry.stack_dump, ""]
        if entry.log_tail:
            lines.append(f"  last {len(entry.log_tail)} log lines before the restart:")
            lines += [f"  {line}" for line in entry.log_tail]
    return lines


class _Progress(BaseModel):
    """The parts of an action's payload the console shows, read with the payload's own models."""

    model_config = ConfigDict(extra="ignore")

    rollout: RolloutPlan | None = None
    captured: dict[str, Captured] | None = None


def _progress(action: Json) -> _Progress:
    try:
        return _Progress.model_validate(action.get("params") or {})
    except ValidationError:
        return _Progress()  # shown without it: an action the console cannot read still lists


def breaker_line(breaker: Json) -> tuple[bool, str]:
    """(tripped, text) for the breaker banner."""
    if breaker.get("tripped"):
        return True, (f"Circuit breaker TRIPPED at {breaker.get('tripped_at')}: {breaker.get('reason')}. Disruptive "
                      "automation is stopped until an operator resets it (POST /v1/remediation/breaker/reset).")
    reset = f" (last reset {breaker['reset_at']} by {breaker.get('reset_by')})" if breaker.get("reset_at") else ""
    return False, f"Circuit breaker closed: automation is running{reset}."


def transition_rows(action: Json) -> list[dict[str, Any]]:
    """The action's trail: every state change, when, by whom and why (``GET /v1/actions/{id}``)."""
    return [{"at": t.get("at"), "from": t.get("from_state") or "(new)", "to": t.get("to_state"),
             "by": t.get("by"), "why": t.get("cause", "")} for t in action.get("transitions") or []]


def guardrail_rows(action: Json) -> list[dict[str, Any]]:
    """Each guardrail's decision on the action, in the order they judged it."""
    return [{"guardrail": g.get("guardrail") or "", "verdict": g.get("verdict"), "reason": g.get("reason", "")}
            for g in action.get("guardrails") or []]


def who_line(action: Json) -> str:
    by = action.get("policy") or "an operator"
    line = f"proposed by {by} (requested by {action.get('requested_by')})"
    if action.get("approved_by"):
        line += f", approved by {action['approved_by']}"
    return line


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    phase: str
    text: str


def rollout_progress(action: Json) -> Progress | None:
    """Where a rolling restart (or canaried rollout) is: replica n of m, and its phase; None without a plan."""
    rollout = _progress(action).rollout
    if rollout is None:
        return None
    total = len(action.get("replicas") or []) or len(rollout.done) + sum(len(b) for b in rollout.queue)
    done = len(rollout.done)
    text = f"{done} of {total} replicas done · phase {rollout.phase}"
    if rollout.batch:
        text += f" · restarting {', '.join(sorted(rollout.batch))}"
    if rollout.waiting:
        text += f" · {rollout.waiting}"
    return Progress(done=done, total=max(total, done), phase=rollout.phase, text=text)
