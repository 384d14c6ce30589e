"""A live cap on the requests a vLLM engine runs: a scheduler plug-in, changed at run time with no restart.

The agent starts the engine with ``--scheduler-cls pitstop_live_cap.LiveCapScheduler`` and this file's directory
on ``PYTHONPATH``, and names the cap file in ``PITSTOP_LIVE_CAP_FILE``. The file holds one whole number, the
most requests the engine may run at once, or ``none``: no cap beyond the startup limit. It imports nothing of
Pitstop: it runs inside the engine, whose Python and packages are vLLM's own.

- ``LiveCapScheduler`` subclasses the scheduler vLLM chose for this engine: ``AsyncScheduler`` where the engine
  schedules asynchronously, ``Scheduler`` otherwise.
- At each step it looks at the cap file's modification time, at most once every ``CHECK_SECONDS``, and reads it
  only when that changed.
- The cap bounds admission into RUNNING (the scheduler's ``max_num_active_reqs``), never above what the engine
  was started with. Requests already running beyond the cap keep their KV cache and their place, but are not
  stepped until the ones admitted before them finish: from the next step on, no more than the cap receive
  tokens at the same moment, and none is preempted or lost. Raising the cap restores admission.
- A missing, unreadable or invalid cap file leaves the engine at its startup limit and is reported, in the
  engine's log and in the state file; it never stops the engine.
- Where this vLLM's scheduler lacks what the plug-in needs, the engine runs vLLM's own scheduler unchanged, and
  the state file says why, so the agent falls back to restarts.

The state file (``PITSTOP_LIVE_CAP_FILE`` + ``.state``, JSON, replaced whole) tells the agent what is in
effect: ``pid``, ``vllm``, ``tested`` (this vLLM among ``TESTED_VERSIONS``), ``scheduler``, ``active``,
``reason``, ``startup_limit``, ``cap`` (in effect), ``requested`` (the file's value) and ``error``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any

ENV_FILE = "PITSTOP_LIVE_CAP_FILE"
CHECK_SECONDS = 0.005
# vLLM versions whose scheduler this plug-in was run against (its tests, a real engine under load).
TESTED_VERSIONS = ("0.32.0",)
# What it reads and sets on vLLM's scheduler (set by its __init__): without these it refuses to enable itself.
NEEDS = ("max_num_active_reqs", "max_num_running_reqs", "running")

log = logging.getLogger("vllm.pitstop_live_cap")


class CapFile:
    """The cap file and the state file beside it; ``current`` is cheap enough to call at every step."""

    def __init__(self, path: str | None, startup_limit: int, *, about: dict[str, Any],
                 clock: Any = time.monotonic) -> None:
        self.path = path
        self.startup_limit = startup_limit
        self.about = about
        self.clock = clock
        self.cap = startup_limit
        self.requested: int | None = None
        self.error: str | None = None
        self._next_check = 0.0
        self._seen: tuple[int, int, int] | None = None  # (mtime_ns, inode, size) of the file last read
        if path is None:
            self._set(None, f"{ENV_FILE} is not set: the engine keeps its startup limit")
        else:
            self._check()

    def current(self) -> int:
        """The cap in effect: the file's value, checked at most every ``CHECK_SECONDS``."""
        now = self.clock()
        if now >= self._next_check:
            self._next_check = now + CHECK_SECONDS
            self._check()
        return self.cap

    def _check(self) -> None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._seen != (0, 0, 0) or self.requested is not None:
                self._seen = (0, 0, 0)
                self._set(None, f"no cap file at {self.path}: the engine keeps its startup limit")
            return
        except OSError as exc:
            self._seen = None
            self._set(None, f"cannot read the cap file {self.path}: {exc}")
            return
        seen = (st.st_mtime_ns, st.st_ino, st.st_size)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            with open(self.path, encoding="ascii") as f:
                text = f.read(64).strip()
            if text.lower() == "none":
                self._set(None, None)
                return
            value = int(text)
            if value < 1:
                raise ValueError(f"{value} is below 1")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self._set(None, f"the cap file {self.path} holds neither 'none' nor a whole number of at least 1 "
                            f"({exc}): the engine keeps its startup limit")
            return
        self._set(value, None)

    def _set(self, requested: int | None, error: str | None) -> None:
        self.requested = requested
        self.cap = self.startup_limit if requested is None else min(requested, self.startup_limit)
        if error != self.error and error is not None:
            log.warning("pitstop live cap: %s", error)
        self.error = error
        write_state(self.path, {**self.about, "startup_limit": self.startup_limit, "cap": self.cap,
                                "requested": self.requested, "error": self.error})


def write_state(path: str | None, state: dict[str, Any]) -> None:
    """Replace the state file beside the cap file ``path`` whole; a full disk must not stop the engine."""
    if path is None:
        return
    tmp = f"{path}.state.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({**state, "at": time.time()}, f)
        os.replace(tmp, f"{path}.state")


class LiveCapMixin:
    """Placed before vLLM's scheduler class: bounds each step's running requests by the live cap."""

    running: list[Any]
    max_num_active_reqs: int
    _live_cap: CapFile | None = None  # None: not enabled, vLLM's own scheduling

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._live_cap is None:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        cap = self._live_cap.current()
        self.max_num_active_reqs = cap
        if len(self.running) <= cap:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        # The requests admitted last wait, with their KV cache, until those before them finish.
        held = self.running[cap:]
        del self.running[cap:]
        try:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.running.extend(held)


def _vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except ImportError:
        return "unknown"


def about(version: str, scheduler: str) -> dict[str, Any]:
    """What the state file says of the engine it runs in: this process, its vLLM version (and whether the
    plug-in was tested on it), the scheduler class it caps."""
    return {"pid": os.getpid(), "vllm": version, "tested": version in TESTED_VERSIONS, "scheduler": scheduler,
            "active": True, "reason": None}


def LiveCapScheduler(*args: Any, **kwargs: Any) -> Any:  # vLLM resolves it by name and calls it as a class
    """The scheduler for this engine: vLLM's own (asynchronous or not, as it chose) with the live cap."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    base: type = AsyncScheduler if getattr(vllm_config.scheduler_config, "async_scheduling", False) else Scheduler
    capped = type(f"LiveCap{base.__name__}", (LiveCapMixin, base), {"__module__": __name__})
    scheduler = capped(*args, **kwargs)
    return enable(scheduler, about(_vllm_version(), base.__name__))


def enable(scheduler: Any, about: dict[str, Any]) -> Any:
    """Turn the cap on for a freshly built scheduler, or leave vLLM's scheduling as it is and say why."""
    missing = [name for name in NEEDS if not hasattr(scheduler, name)]
    if missing or not isinstance(getattr(scheduler, "running", None), list) or not hasattr(scheduler, "schedule"):
        why = (f"vLLM {about['vllm']}'s {about['scheduler']} has no "
               f"{', '.join(missing) or 'running list or schedule()'}")
        log.warning("pitstop live cap not enabled: %s; the engine keeps its startup limit", why)
        startup = getattr(scheduler, "max_num_running_reqs", None)
        write_state(os.environ.get(ENV_FILE), {**about, "active": False, "reason": why, "startup_limit": startup,
                                               "cap": startup, "requested": None, "error": None})
        return scheduler
    if not about["tested"]:
        log.warning("pitstop live cap: vLLM %s is not among the versions it was tested on (%s)", about["vllm"],
                    ", ".join(TESTED_VERSIONS))
    scheduler._live_cap = CapFile(os.environ.get(ENV_FILE), int(scheduler.max_num_active_reqs), about=about)
    return scheduler
