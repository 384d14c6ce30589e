"""A replica's live cap on running requests: the cap file the agent writes, the state its engine writes back.

With ``live_limits: true`` the engine runs the scheduler plug-in ``agent/live_cap/pitstop_live_cap.py``
(``--scheduler-cls``, its directory on ``PYTHONPATH``). The agent tells it the cap through one small file,
replaced whole: a whole number, or ``none`` for no cap beyond the engine's startup limit. The plug-in checks
the file's modification time every few milliseconds and writes what is in effect to the file beside it
(``.state``, JSON), which the agent reads for each report: ``live_cap`` and ``live_limits`` in the replica's
status (docs/design.md, "Live cap").
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from agent.live_cap import PLUGIN_DIR, SCHEDULER_CLS
from agent.wire import LiveLimits

CAP_FILE_VAR = "PITSTOP_LIVE_CAP_FILE"
SCHEDULER_FLAG = "--scheduler-cls"


def names_scheduler(args: list[str]) -> bool:
    """Whether engine flags already choose a scheduler class (the plug-in cannot then be put in its place)."""
    return any(a == SCHEDULER_FLAG or a.startswith(f"{SCHEDULER_FLAG}=") for a in args)


def scheduler_flags(args: list[str]) -> list[str]:
    """The flags that load the plug-in, unless ``args`` name a scheduler of their own."""
    return [] if names_scheduler(args) else [SCHEDULER_FLAG, SCHEDULER_CLS]


class LiveCapFile:
    """One replica's cap file under the agent's state dir, and the plug-in's state file beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state_path = path.with_name(path.name + ".state")
        self.written: int | None = None

    def engine_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the plug-in's directory first on ``PYTHONPATH`` and the cap file named."""
        paths = [str(PLUGIN_DIR), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        return {**env, "PYTHONPATH": os.pathsep.join(paths), CAP_FILE_VAR: str(self.path)}

    def write(self, cap: int | None) -> None:
        """Replace the cap file whole (the plug-in never reads half of it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("none\n" if cap is None else f"{cap}\n")
        os.replace(tmp, self.path)
        self.written = cap

    def forget_state(self) -> None:
        """Before an engine starts: a state left by the one before must not pass for the new one's."""
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()

    def state(self) -> LiveLimits | None:
        """What the plug-in last wrote; None while it has written nothing (the engine still starting)."""
        try:
            text = self.state_path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return LiveLimits(active=False, reason=f"cannot read {self.state_path}: {exc}")
        try:
            data = json.loads(text)
            fields = {k: data.get(k) for k in LiveLimits.model_fields if k != "asked"}  # the agent's, not its
            return LiveLimits.model_validate(fields)
        except (ValueError, ValidationError, AttributeError) as exc:
            return LiveLimits(active=False, reason=f"unreadable plug-in state {self.state_path}: {exc}"[:1000])
