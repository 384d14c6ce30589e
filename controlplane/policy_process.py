"""The policy rounds in a process of their own, beside the API process of ``pitstop server``.

At fleet scale a round is seconds of pure-Python work (8,000 replicas' histories through every policy).
In the API process it would share one interpreter lock with the report path, and reports would wait
behind it; in its own process it runs on another core. The API process stays the leader and tells the
policy process whether it leads (a shared flag, set on every election tick), pokes it after each report
(the round runs ``policy_debounce_seconds`` later, once per burst) and reads back each round's duration and
the actions its rounds finished (suppressed, shadow, a page) for its ``/metrics``. The policy process writes
only what a round writes (action records, alerts, applied desired state), through its own database connection;
it exits when its parent does, however the parent ended.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from controlplane.config import ServerConfig
from controlplane.policy.due import wait_seconds
from controlplane.policy.lifecycle import ActionState

log = logging.getLogger(__name__)
_SPAWN = multiprocessing.get_context("spawn")  # no fork: the parent has threads and open connections


class PolicyProcess:
    """The API process's handle on the policy process."""

    def __init__(self, config: ServerConfig, *, on_round: Callable[[float, float], None] = lambda *_: None,
                 on_finished: Callable[[str, ActionState], None] = lambda _kind, _state: None,
                 log_level: str = "info") -> None:
        self._on_round = on_round
        self._on_finished = on_finished
        # A lock-free byte: written by the election job, read by the policy process each round.
        self._leader: Synchronized[int] = _SPAWN.RawValue("b", 0)
        # Samples the policy process's history holds (leading or following), written after each round or follow.
        self._held: Synchronized[int] = _SPAWN.RawValue("q", 0)
        # Shards of the policy rounds the policy process holds (docs/design.md, "Spreading rounds").
        self._shards: Synchronized[int] = _SPAWN.RawValue("h", 0)
        self._poke = _SPAWN.Event()
        self._stop = _SPAWN.Event()
        # (duration, when it ended as Unix time) of each round.
        self._rounds: multiprocessing.Queue[tuple[float, float]] = _SPAWN.Queue()
        # (kind, final state) of each action the policy process's rounds finished, once committed.
        self._finished: multiprocessing.Queue[tuple[str, str]] = _SPAWN.Queue()
        self._process = _SPAWN.Process(
            target=worker_main, name="pitstop-policy", daemon=True,
            args=(config, log_level, self._leader, self._poke, self._stop, self._rounds, os.getpid(),
                  self._finished, self._held, self._shards))

    def start(self) -> None:
        self._process.start()
        log.info("policy rounds run in process %s", self._process.pid)

    def set_leader(self, leads: bool) -> None:
        self._leader.value = 1 if leads else 0
        self._collect_rounds()

    def poke(self) -> None:
        self._poke.set()

    @property
    def history_samples(self) -> int:
        return int(self._held.value)

    @property
    def shards_held(self) -> int:
        return int(self._shards.value)

    def alive(self) -> bool:
        return self._process.is_alive()

    def _collect_rounds(self) -> None:
        while True:
            try:
                self._on_round(*self._rounds.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                kind, state = self._finished.get_nowait()
            except queue.Empty:
                return
            self._on_finished(kind, ActionState(state))

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._poke.set()
        if self._process.pid is None:
            return
        self._collect_rounds()  # read what it queued: a full pipe would hold up its exit
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()  # it ignores SIGTERM (see worker_main)
            self._process.join(timeout)
        self._collect_rounds()


def worker_main(config: ServerConfig, log_level: str, leader: Synchronized[int], poke: Event, stop: Event,
                rounds: multiprocessing.Queue[tuple[float, float]], parent: int,
                finished: multiprocessing.Queue[tuple[str, str]], held: Synchronized[int] | None = None,
                shards: Synchronized[int] | None = None) -> None:
    """The policy process: a round every ``policy_interval_seconds`` and after pokes, while the parent leads;
    while it follows, the same pace keeps the sample history current (``PolicyRounds.follow``).

    It ignores SIGINT, SIGTERM and SIGHUP: a Ctrl-C, a stop signal to the process group or a closed terminal
    is the API process's to handle, which then stops this one in order; one killed mid-wait could leave a
    shared lock taken and hang the API process's shutdown. It ends the moment the API process is gone, however
    that went (SIGKILL included): see ``_exit_with_parent``.

    It runs at the niceness ``policy_process_nice`` (0 by default, as the API process: a niced round yielded to
    every other process on a busy host, and the decisions waited, while reports were answered as fast either way).
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _exit_with_parent(parent)
    if config.policy_process_nice:
        os.nice(config.policy_process_nice)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s policy: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from controlplane.heap import ROUNDS_ONLY_COLLECT_SECONDS, HeapFreezer
    from controlplane.remediation.finished import watch
    from controlplane.rounds import PolicyRounds
    from controlplane.store.db import make_engine, make_sessionmaker

    engine = make_engine(config.database_url)
    sessions = make_sessionmaker(engine)
    watch(sessions, lambda kind, state: finished.put((kind, state.value)))
    # This process does nothing but rounds: its collector stays off, and collects on its own schedule (``heap``).
    runner = PolicyRounds(sessions=sessions, config=config, clock=lambda: datetime.now(UTC),
                          heap=HeapFreezer(collect_seconds=ROUNDS_ONLY_COLLECT_SECONDS))
    due: datetime | None = None  # when a condition under way completes its for: (the last round's next_due)
    debounce = config.policy_debounce_seconds  # before the next round, after a poke (``debounce_after``)
    try:
        while not stop.is_set() and os.getppid() == parent:
            next_round(poke, stop, wait_seconds(due, datetime.now(UTC), config.policy_interval_seconds),
                       debounce)
            debounce = config.policy_debounce_seconds
            due = None
            if stop.is_set():
                break
            holds = runner.holds(bool(leader.value))
            if shards is not None:
                shards.value = len(runner.part.held) if runner.part is not None else 0
            if not holds:
                if config.policy_warm_standby:
                    _follow(runner)
                if held is not None:
                    held.value = len(runner.samples)
                continue
            due, took = _one_round(runner, rounds)
            due = _urgent_round(runner, due)  # the moments that came while it ran
            debounce = debounce_after(config.policy_debounce_seconds, took, poke.is_set())
            if held is not None:
                held.value = len(runner.samples)
    finally:
        runner.release()
        engine.dispose()


def next_round(poke: Event | threading.Event, stop: Event | threading.Event, wait: float, debounce: float) -> None:
    """Wait until the next round is due: ``wait`` seconds, or a poke (a report) and then ``debounce`` more, so
    that a burst of reports makes one round."""
    if poke.wait(timeout=wait) and not stop.is_set():
        if debounce > 0:
            stop.wait(debounce)
        poke.clear()


def debounce_after(debounce: float, took: float, poked: bool) -> float:
    """The debounce before the round after one that took ``took`` seconds, ``poked``: whether reports poked
    while it ran. Nothing when they did and it took at least the debounce: they have waited that long already, and
    at fleet scale, where rounds run back to back, a quarter second more before each would only delay the round
    that judges them (and every round after it)."""
    return 0.0 if poked and took >= debounce else debounce


def _exit_with_parent(parent: int) -> None:
    """End this process as soon as the API process that started it is gone.

    multiprocessing hands a spawned child the read end of a pipe whose only write end its parent holds
    (``parent_process().sentinel``): it reads end-of-file the moment the parent dies, of any signal. A thread
    waits on it. Not prctl's PR_SET_PDEATHSIG: that follows the thread that started the child, here a thread
    pool's worker (the app's lifespan runs ``Jobs.start`` in one), which may end while the server runs on.
    """
    if os.getppid() != parent:  # it was gone before this process got here
        os._exit(0)
    parent_proc = multiprocessing.parent_process()
    if parent_proc is None:  # not started by multiprocessing: nothing to watch
        return

    def exit_when_gone() -> None:
        multiprocessing.connection.wait([parent_proc.sentinel])
        # Abrupt on purpose: nobody is left to stop this process in order; the database rolls back what a
        # round had not committed, as it would after a SIGKILL.
        os._exit(0)

    threading.Thread(target=exit_when_gone, name="parent-watch", daemon=True).start()


def _follow(runner: Any) -> None:
    try:
        runner.follow()
    except Exception:  # the next interval retries; the history stays as it was
        log.exception("following the sample history failed")


def _urgent_round(runner: Any, due: datetime | None) -> datetime | None:
    """``PolicyRounds.run_urgent`` after a round; the earlier of ``due`` and its ``next_due``. Not among the
    rounds reported (their durations are the whole rounds')."""
    try:
        done = runner.run_urgent()
    except Exception:  # the next round reads what it would have
        log.exception("urgent policy round failed")
        return due
    if done is None or done[0].next_due is None:
        return due
    return done[0].next_due if due is None else min(due, done[0].next_due)


def _one_round(runner: Any, rounds: multiprocessing.Queue[tuple[float, float]]) -> tuple[datetime | None, float]:
    """One round; returns its ``next_due`` (None when it was skipped or failed) and its seconds (0 when skipped
    or failed)."""
    try:
        done = runner.run()
    except Exception:  # the next round retries; one bad round must not end the policy process
        log.exception("policy round failed")
        return None, 0.0
    if done is None:
        return None, 0.0
    rounds.put((done[1], datetime.now(UTC).timestamp()))
    return (done[0].next_due if done[0] is not None else None), done[1]
