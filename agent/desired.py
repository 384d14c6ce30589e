"""The control plane's desired state on this node: what it means for each replica, and its copy on disk.

Level-triggered (docs/design.md): each report's answer is the whole desired state; the agent compares it with
what runs and converges. The last answer is kept under the state dir, so an agent restarted while the
control plane is away still runs the generation it was last told to run.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from agent.wire import DesiredState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Want:
    """What the replica should be doing: run ``args`` at ``generation``, or be stopped."""

    enabled: bool
    generation: int
    args: list[str] = field(default_factory=list)
    # Dump the running engine's stacks before leaving it for ``generation`` (a restart for a stall).
    capture_stack: bool = False
    # The live cap on running requests (``agent.live_limits``): changed with no new generation, no restart.
    live_cap: int | None = None


def plan_wants(desired: DesiredState, current: dict[str, Want]) -> dict[str, Want]:
    """The replicas whose wish changes, and to what. Pure.

    A higher generation means "run these engine args" (a restart even when the args did not change: a
    scheduled restart against a slow leak is a new generation too). The same generation with a flipped
    ``enabled`` means stop or start again. Lower generations are stale answers and are ignored; unknown
    replica names are ignored too (the control plane cannot create replicas the node has no config for).
    A changed ``live_cap`` alone is a change too, at the same generation: the engine takes it live.
    """
    changes: dict[str, Want] = {}
    for spec in desired.replicas:
        now = current.get(spec.name)
        if now is None:
            continue
        if spec.generation > now.generation:
            changes[spec.name] = Want(spec.enabled, spec.generation, list(spec.engine_args), spec.capture_stack,
                                      spec.live_cap)
        elif spec.generation == now.generation and (spec.enabled, spec.live_cap) != (now.enabled, now.live_cap):
            changes[spec.name] = Want(spec.enabled, now.generation, list(now.args), now.capture_stack, spec.live_cap)
    return changes


class DesiredStore:
    """``desired.json`` under the state dir; written atomically (temp file + rename)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "desired.json"

    def load(self) -> DesiredState | None:
        try:
            return DesiredState.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self.path, exc)
            return None

    def save(self, desired: DesiredState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(desired.model_dump(mode="json"), indent=2))
        os.replace(tmp, self.path)
