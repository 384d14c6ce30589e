"""Checks of the live-cap plug-in on vLLM's real scheduler classes, run by vLLM's own Python.

``python scheduler_checks.py OUT`` builds ``LiveCapScheduler`` as the engine core does
(``bench/harness/vllm_scheduler.py``: a tiny Llama's config, a KV cache of 64 blocks), steps it with the model's
outputs made up (one token per scheduled request), and writes each check's outcome to OUT as JSON:
``{name: null | "what failed"}``. It imports nothing of Pitstop but the plug-in, as the engine does.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import vllm_scheduler as vs

plugin = vs.plugin
STARTUP = 4


class Engine:
    """One scheduler as the engine core builds it, and a model that samples one token per scheduled request."""

    def __init__(self, *, async_scheduling: bool) -> None:
        self.dir = Path(tempfile.mkdtemp())
        self.cap_file = self.dir / "live_cap"
        self.scheduler: Any = vs.build(max_num_seqs=STARTUP, async_scheduling=async_scheduling,
                                       cap_file=self.cap_file)
        self.finished: list[str] = []

    def add(self, name: str, tokens: int = 50) -> None:
        vs.add(self.scheduler, name, tokens)

    def step(self) -> list[str]:
        """One step: the ids that were given a token."""
        ids, finished = vs.step(self.scheduler)
        self.finished += finished
        return ids

    def set_cap(self, text: str) -> None:
        self.cap_file.write_text(text)
        time.sleep(2 * plugin.CHECK_SECONDS)  # the plug-in looks again after this long

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.dir / "live_cap.state").read_text()))

    @property
    def running(self) -> int:
        return len(self.scheduler.running)


def check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def each_scheduler(case: Callable[[Engine], None]) -> Callable[[], None]:
    @functools.wraps(case)
    def both() -> None:
        for async_scheduling in (False, True):
            engine = Engine(async_scheduling=async_scheduling)
            expected = "AsyncScheduler" if async_scheduling else "Scheduler"
            check(engine.state()["scheduler"] == expected and type(engine.scheduler).__name__ == f"LiveCap{expected}",
                  f"async_scheduling={async_scheduling}: built {type(engine.scheduler).__mro__}")
            case(engine)
    return both


@each_scheduler
def lowering_holds_the_later_requests_and_preempts_none(engine: Engine) -> None:
    for i in range(STARTUP + 1):
        engine.add(f"r{i}")
    check(engine.step() == ["r0", "r1", "r2", "r3"], "the startup limit admits four")
    engine.set_cap("2")
    stepped = engine.step()
    check(stepped == ["r0", "r1"], f"after lowering to 2, the next step gave tokens to {stepped}")
    check(engine.running == STARTUP, f"{engine.running} running: the held ones keep their place and KV cache")
    check(len(engine.scheduler.waiting) == 1, "r4 still waits")
    state = engine.state()
    check((state["cap"], state["requested"], state["active"]) == (2, 2, True), f"state {state}")


@each_scheduler
def held_requests_resume_as_the_earlier_ones_finish(engine: Engine) -> None:
    engine.add("short0", tokens=3)
    engine.add("short1", tokens=3)
    engine.add("long0")
    engine.add("long1")
    engine.step()
    engine.set_cap("2")
    seen = [engine.step() for _ in range(6)]
    check(all(len(s) <= 2 for s in seen), f"more than two stepped at once: {seen}")
    check({"short0", "short1"} <= set(engine.finished), f"the first two finish: {engine.finished} ({seen})")
    check(seen[-1] == ["long0", "long1"], f"then the held two step: {seen}")


@each_scheduler
def raising_restores_admission_and_never_passes_the_startup_limit(engine: Engine) -> None:
    for i in range(6):
        engine.add(f"r{i}")
    engine.set_cap("1")
    check(engine.step() == ["r0"], "a cap of 1 from the first step")
    engine.set_cap("3")
    check(len(engine.step()) == 3, "raised to 3")
    engine.set_cap("100")
    stepped = engine.step()
    check(len(stepped) == STARTUP and engine.running == STARTUP, f"100 gives the startup limit: {stepped}")
    check(engine.state()["cap"] == STARTUP, f"state {engine.state()}")


@each_scheduler
def a_bad_or_missing_cap_file_leaves_the_startup_limit_and_says_so(engine: Engine) -> None:
    for i in range(5):
        engine.add(f"r{i}")
    check(engine.state()["error"].startswith("no cap file"), f"no file yet: {engine.state()}")
    engine.set_cap("2")
    engine.step()
    for bad in ("two", "0", "-3", ""):
        engine.set_cap(bad)
        stepped = engine.step()
        check(len(stepped) == STARTUP, f"cap file {bad!r}: stepped {stepped}")
        check("holds neither" in (engine.state()["error"] or ""), f"cap file {bad!r}: {engine.state()}")
    engine.set_cap("2")
    engine.cap_file.unlink()
    time.sleep(2 * plugin.CHECK_SECONDS)
    check(len(engine.step()) == STARTUP, "a removed file gives the startup limit back")
    check(engine.state()["error"].startswith("no cap file"), f"removed: {engine.state()}")


def a_scheduler_without_what_it_needs_is_left_alone_and_the_reason_kept() -> None:
    engine = Engine(async_scheduling=False)
    scheduler = engine.scheduler
    scheduler._live_cap = None
    del scheduler.max_num_active_reqs  # as a vLLM without admission apart from the slots would be
    about = {"pid": os.getpid(), "vllm": "9.9.9", "tested": False, "scheduler": "Scheduler", "active": True,
             "reason": None}
    check(plugin.enable(scheduler, about) is scheduler and scheduler._live_cap is None, "not enabled")
    state = engine.state()
    check(state["active"] is False and "has no max_num_active_reqs" in state["reason"], f"state {state}")
    check(state["cap"] == STARTUP, f"the startup limit: {state}")


CHECKS = [lowering_holds_the_later_requests_and_preempts_none, held_requests_resume_as_the_earlier_ones_finish,
          raising_restores_admission_and_never_passes_the_startup_limit,
          a_bad_or_missing_cap_file_leaves_the_startup_limit_and_says_so,
          a_scheduler_without_what_it_needs_is_left_alone_and_the_reason_kept]


def main(out: str) -> None:
    results: dict[str, str | None] = {}
    for case in CHECKS:
        try:
            case()
            results[case.__name__] = None
        except Exception:
            results[case.__name__] = traceback.format_exc()
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
