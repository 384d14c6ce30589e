"""The console's Actions section, as data: API reads and writes, and API JSON -> rows and lines. No Streamlit.

Shows why Pitstop did, or did not, do something: each action's state, policy, target, reason, the guardrails'
verdicts and the evidence behind them; the proposals waiting for an operator; the circuit breaker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from controlplane.console.client import ApiUnavailable, _get
from controlplane.console.projection import duration_text
from controlplane.console.shaping import Json, _parse_time
from controlplane.policy.lifecycle import FINAL
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
        lines += evidence_figures(figures)
    if rollout is not None and rollout.baseline:
        baseline = rollout.baseline
        lines.append("  judged against: " + (", ".join(baseline) if isinstance(baseline, list) else str(baseline)))
    if rollout is not None and rollout.waiting:
        lines.append(f"rollout {rollout.waiting}")
    return lines


def evidence_figures(figures: Mapping[str, float | None]) -> list[str]:
    """Where a canary's evidence stands, per judged latency: θ (the chance one of its observations exceeds
    ``ratio`` times one of the baseline's), n a side, and z against the boundary a verdict needs."""
    lines = []
    bound, ratio = figures.get("z_boundary"), figures.get("ratio")
    for latency in ("itl", "ttft"):
        effect, z = figures.get(f"{latency}_effect"), figures.get(f"{latency}_z")
        if effect is None or z is None or bound is None:
            continue
        mine, theirs = figures.get(f"{latency}_n_canary") or 0, figures.get(f"{latency}_n_baseline") or 0
        standing = "worse" if z > bound else "no worse" if z < -bound else "undecided"
        lines.append(f"  evidence, {latency}: P(canary > {ratio or 1:.2f}x baseline) {effect:.2f} over "
                     f"n {mine:,.0f} vs {theirs:,.0f}; z {z:+.1f}, a verdict at ±{bound:.2f}: {standing}")
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
    batch_size: int = 1  # a rolling restart's; every other rollout goes one replica at a time


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


def rollout_progress(action: Json, now: datetime, *, canary_window: timedelta | None = None) -> Progress | None:
    """Where a rolling restart (or canaried rollout) is: replica n of m, its phase, and the time left as of
    ``now``, when the page read the action (the estimate is of the data shown, so nothing here reads a clock);
    None without a plan. The canary's countdown is to the plan's ``canary_judged_at``; ``canary_window`` (the
    control plane's ``canary_window_seconds``) stands in for a plan recorded before it kept that."""
    progress = _progress(action)
    rollout = progress.rollout
    if rollout is None:
        return None
    total = len(action.get("replicas") or []) or len(rollout.done) + sum(len(b) for b in rollout.queue)
    done = len(rollout.done)
    text = f"{done} of {total} replicas done · phase {rollout.phase}"
    if rollout.batch:
        text += f" · restarting {', '.join(sorted(rollout.batch))}"
    if rollout.waiting:
        text += f" · {rollout.waiting}"
    left = None if action.get("state") in FINAL else _time_left(action, progress, now, canary_window)
    if left is not None:
        text += f" · {left}"
    return Progress(done=done, total=max(total, done), phase=rollout.phase, text=text)


def _time_left(action: Json, progress: _Progress, now: datetime, canary_window: timedelta | None) -> str | None:
    """The time left, from the action's own record: the pace of the batches done so far times the batches
    still to go, less the time the one in flight has already had; for a canary, its READY plus the window.

    A batch's own duration is not kept (the plan keeps only the current batch's start), so the pace is the
    time from the claim (``started_at``) to the current batch's start over the batches done, budget waits
    included. A canaried rollout's time includes judging the canary, which is no replica's restart: its pace is
    the canary's own restart, from the claim (its batch started then) to its READY. The console's clock and the
    control plane's may differ by a little, so every span is held at zero or more.
    """
    rollout = progress.rollout
    assert rollout is not None
    started = _parse_time(action.get("started_at"))
    if rollout.phase == "canary":
        ready = rollout.canary_ready_at
        if ready is None:
            return "time left: known once the canary is back"
        judged_at = rollout.canary_judged_at or (None if canary_window is None else ready + canary_window)
        waiting = rollout.canary_verdict is not None and rollout.canary_verdict.verdict == "wait"
        if waiting and (judged_at is None or now >= judged_at):
            return "canary judged once enough of its readings come"  # its window has run
        if judged_at is None:  # a plan recorded before it kept the moment
            return f"canary READY for {_seconds_text((now - ready).total_seconds())}, judged once its window has run"
        due = (judged_at - now).total_seconds()
        if due <= 0:
            return "canary judged any moment now"
        return f"canary judged within {_seconds_text(due)}, sooner once its evidence is in"
    if rollout.phase != "rolling" or not (rollout.queue or rollout.batch) or started is None:
        return None
    if rollout.canary is not None:
        if rollout.canary_ready_at is None:
            return None
        per_batch = (rollout.canary_ready_at - started).total_seconds()
    else:
        finished = -(-len(rollout.done) // max(progress.batch_size, 1))
        if not finished:
            return "time left: known once the first replica is back"
        until = rollout.batch_started_at if rollout.batch and rollout.batch_started_at is not None else now
        per_batch = (until - started).total_seconds() / finished
    per_batch = max(per_batch, 0.0)
    left = per_batch * len(rollout.queue)
    if rollout.batch:
        in_flight = 0.0 if rollout.batch_started_at is None else (now - rollout.batch_started_at).total_seconds()
        left += max(per_batch - max(in_flight, 0.0), 0.0)
    return f"about {_seconds_text(left)} left" if left > 0 else "done any moment now"


def _seconds_text(seconds: float) -> str:
    """A time as a person says it: to 5 s under two minutes (never below 5 s), then to the minute."""
    fives = 5 * round(max(seconds, 0.0) / 5)
    if fives < 120:
        return f"{max(fives, 5)} s"
    return duration_text(60 * round(seconds / 60))
