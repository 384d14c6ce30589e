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
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import ValidationError

from agent.live_cap import PLUGIN_DIR
from agent.wire import LiveLimits

CAP_FILE_VAR = "PITSTOP_LIVE_CAP_FILE"
class LiveCapFile:
    """One replica's cap file under the agent's state dir, and the plug-in's state file beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state_path = path.with_name(path.name + ".state")
        self.written: int | None = None
        # The state as last read, and the file's (inode, mtime, size) then: status() is asked for at every report,
        # API read and scrape, and the plug-in replaces the file (a new inode) only when its cap or activity
        # changes.
        self._read: tuple[tuple[int, int, int], LiveLimits] | None = None

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
        self._read = None
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()

    def state(self) -> LiveLimits | None:
        """What the plug-in last wrote; None while it has written nothing (the engine still starting). Read
        again only when the file changed (the plug-in replaces it whole: a new inode)."""
        try:
            st = self.state_path.stat()
        except FileNotFoundError:
            self._read = None
            return None
        except OSError as exc:
            return LiveLimits(active=False, reason=f"cannot read {self.state_path}: {exc}")
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._read is not None and self._read[0] == stamp:
            return self._read[1]
        state = self._parse()
        if state is not None:
            self._read = (stamp, state)
        return state

    def _parse(self) -> LiveLimits | None:
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


class LiveCap:
    """One replica's live cap, as its supervisor drives it: what is asked, through the cap file, and what the
    engine's plug-in says back. ``note`` records an event of the replica (kind, message)."""

    def __init__(self, path: Path, note: Callable[[str, str], object]) -> None:
        self.file = LiveCapFile(path)
        self.note = note
        self._said: tuple[int, bool, bool | None] | None = None  # (generation, active, tested) last said

    def ask(self, cap: int | None) -> None:
        """A new cap for the engine running now: it takes it at its next step; no restart, no drain."""
        self.file.write(cap)
        self.note("live_cap", f"live cap {'none' if cap is None else cap} written for the engine to take at its "
                              "next step (no restart)")

    def adopted(self, cap: int | None) -> None:
        """An engine left by a previous agent is adopted: the cap file says what is wanted now, not what that
        agent wrote."""
        self.file.write(cap)

    def starting(self, cap: int | None, env: Mapping[str, str]) -> dict[str, str]:
        """Before an engine starts: no state of the one before, the cap wanted now, and the engine's environment."""
        self.file.forget_state()
        self.file.write(cap)
        return self.file.engine_env(env)

    def status(self, generation: int) -> dict[str, LiveLimits | int | None]:
        """``live_limits`` as the engine's plug-in last wrote it (with what was asked), and ``live_cap`` in
        effect while it is active. The first state of each engine that is not active, or runs a vLLM the
        plug-in was not tested on, is said once as an event."""
        state = self.file.state()
        if state is None:
            return {}
        said = (generation, state.active, state.tested)
        if said != self._said:
            self._said = said
            if not state.active:
                self.note("live_cap", f"live cap not enabled: {state.reason}; a --max-num-seqs change restarts "
                                      "this engine")
            elif state.tested is False:
                self.note("live_cap", f"live cap active on vLLM {state.vllm}, a version its plug-in was not tested "
                                      "on")
        state = state.model_copy(update={"asked": self.file.written})
        return {"live_limits": state, "live_cap": state.cap if state.active else None}
