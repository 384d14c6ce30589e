"""The policy rounds in a process of their own, beside the API process of ``pitstop server``.

At fleet scale a round is seconds of pure-Python work (8,000 replicas' histories through every policy).
In the API process it would share one interpreter lock with the report path, and reports would wait
behind it; in its own process it runs on another core. The API process stays the leader and tells the
policy process whether it leads (a shared flag, set on every election tick), pokes it after each report
(the round runs ``policy_debounce_seconds`` later, once per burst) and reads back each round's duration and
the actions its rounds finished (suppressed, shadow, a page) for its ``/metrics``. The policy process writes
only what a round writes (action records, alerts, applied desired state), through its own database connection;
it exits when its parent does.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from controlplane.config import ServerConfig
from controlplane.policy.lifecycle import ActionState

log = logging.getLogger(__name__)
_SPAWN = multiprocessing.get_context("spawn")  # no fork: the parent has threads and open connections


class PolicyProcess:
    """The API process's handle on the policy process."""

    def __init__(self, config: ServerConfig, *, on_round: Callable[[float], None] = lambda _: None,
                 on_finished: Callable[[str, ActionState], None] = lambda _kind, _state: None,
                 log_level: str = "info") -> None:
        self._on_round = on_round
        self._on_finished = on_finished
        # A lock-free byte: written by the election job, read by the policy process each round.
        self._leader: Synchronized[int] = _SPAWN.RawValue("b", 0)
        self._poke = _SPAWN.Event()
        self._stop = _SPAWN.Event()
        self._rounds: multiprocessing.Queue[float] = _SPAWN.Queue()
        # (kind, final state) of each action the policy process's rounds finished, once committed.
        self._finished: multiprocessing.Queue[tuple[str, str]] = _SPAWN.Queue()
        self._process = _SPAWN.Process(
            target=worker_main, name="pitstop-policy", daemon=True,
            args=(config, log_level, self._leader, self._poke, self._stop, self._rounds, os.getpid(),
                  self._finished))

    def start(self) -> None:
        self._process.start()
        log.info("policy rounds run in process %s", self._process.pid)

    def set_leader(self, leads: bool) -> None:
        self._leader.value = 1 if leads else 0
        self._collect_rounds()

    def poke(self) -> None:
        self._poke.set()

    def alive(self) -> bool:
        return self._process.is_alive()

    def _collect_rounds(self) -> None:
        while True:
            try:
                self._on_round(self._rounds.get_nowait())
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
                rounds: multiprocessing.Queue[float], parent: int,
                finished: multiprocessing.Queue[tuple[str, str]]) -> None:
    """The policy process: a round every ``policy_interval_seconds`` and after pokes, while the parent leads.

    It ignores SIGINT and SIGTERM: a Ctrl-C or a stop signal to the process group is the API process's to
    handle, which then stops this one in order; one killed mid-wait could leave a shared lock taken and hang
    the API process's shutdown. It also ends when the API process is gone.

    It runs at a lower CPU priority (``policy_process_nice``): where cores are short, a round may take longer,
    but agents' reports and operators' requests are answered first.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if config.policy_process_nice:
        os.nice(config.policy_process_nice)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s policy: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from controlplane.heap import HeapFreezer
    from controlplane.remediation.finished import watch
    from controlplane.rounds import PolicyRounds
    from controlplane.store.db import make_engine, make_sessionmaker

    engine = make_engine(config.database_url)
    sessions = make_sessionmaker(engine)
    watch(sessions, lambda kind, state: finished.put((kind, state.value)))
    runner = PolicyRounds(sessions=sessions, config=config, clock=lambda: datetime.now(UTC), heap=HeapFreezer())
    led = False
    try:
        while not stop.is_set() and os.getppid() == parent:
            if poke.wait(timeout=config.policy_interval_seconds) and not stop.is_set():
                stop.wait(config.policy_debounce_seconds)  # a burst of reports makes one round
                poke.clear()
            if stop.is_set():
                break
            if not leader.value:
                if led:
                    runner.forget()
                led = False
                continue
            led = True
            _one_round(runner, rounds)
    finally:
        engine.dispose()


def _one_round(runner: Any, rounds: multiprocessing.Queue[float]) -> None:
    try:
        done = runner.run()
    except Exception:  # the next round retries; one bad round must not end the policy process
        log.exception("policy round failed")
        return
    if done is not None:
        rounds.put(done[1])
