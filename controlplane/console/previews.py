"""An action's preview and outcome as lines to read before and after the click. Pure.

The preview is the control plane's dry run (``?dry_run=true``, ``remediation/preview.py``): the guardrails'
verdict and the blast radius, recorded nowhere. The outcome is the recorded action, or the API's refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane.console.client import Outcome
from controlplane.console.shaping import Json

# Verdicts that let the action go ahead now (an approval wait is neither a yes nor a refusal).
GOES_AHEAD = frozenset({"allowed"})


@dataclass(frozen=True)
class Request:
    """One write the console may send: what the button says, where it goes, and whether it has a dry run."""

    key: str
    label: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    # POST …/actions answer ``?dry_run=true`` with the guardrails' decision and the blast radius.
    previewable: bool = False
    # Said before confirming, for a write without a dry run.
    effect: str = ""


def preview_lines(preview: Json) -> list[str]:
    """What would happen: the summary line, the verdict and who decided it, and the replicas it stops."""
    verdict = str(preview.get("verdict", ""))
    decided = verdict + (f" by {preview['guardrail']}" if preview.get("guardrail") else "")
    if preview.get("reason"):
        decided += f": {preview['reason']}"
    lines = [str(preview.get("summary") or ""), f"guardrails: {decided}",
             f"it would be recorded as {preview.get('state')}" + (" (forced)" if preview.get("forced") else "")]
    replicas = preview.get("replicas") or []
    lines.append("replicas it stops or restarts: " + (", ".join(replicas) if replicas else "none"))
    for m in preview.get("impact") or []:
        lines.append(f"{m['model']}: {m['ready']} of {m['replicas']} READY, {m['out_at_once']} out at once, "
                     f"{m['stay_serving']} stay serving (budget floor {m['floor']})")
    return [line for line in lines if line]


def goes_ahead(preview: Json) -> bool:
    return str(preview.get("verdict")) in GOES_AHEAD


def outcome_line(outcome: Outcome) -> str:
    """After the click: the action's id and state (and the guardrail's reason when it was held), or the refusal."""
    if not outcome.ok:
        return outcome.message
    body = outcome.body if isinstance(outcome.body, dict) else {}
    if "state" not in body or "id" not in body:
        return "done"
    line = f"action #{body['id']} {body.get('kind', '')} {body.get('target', '')}: {body['state']}"
    held = [g for g in body.get("guardrails") or [] if g.get("verdict") not in GOES_AHEAD]
    if held and body["state"] in ("suppressed", "proposed", "shadow"):
        g = held[0]
        line += f" ({g.get('verdict')} by {g.get('guardrail')}: {g.get('reason')})"
    return line
