"""Data-parallel engines behind one API server, as SGLang runs ``--dp-size`` N: N schedulers, each with its own
batch, running limit and KV cache, and a controller that hands each new request to the next one in turn (SGLang's
default ``round_robin``).

``DataParallel`` answers what the server and the routes ask of one ``Engine``, so neither knows how many ranks
there are. The ranks live and die together: a hang, a crash, a stop reaches all of them, and one rank's death
(a CUDA out-of-memory) takes the others down, as a dead SGLang scheduler takes its whole server down.
"""

from __future__ import annotations

import asyncio
import weakref

from enginesim.clock import Clock
from enginesim.engine import Engine, EngineState, RequestHandle
from enginesim.faults import HangGauges
from enginesim.scheduler import Scheduler
from enginesim.sink import MetricsSink


class DataParallel:
    """Round-robin dispatch over engines that share one clock."""

    def __init__(self, engines: list[Engine]) -> None:
        assert engines, "at least one rank"
        self.engines = engines
        self.clock: Clock = engines[0].clock
        self.died = asyncio.Event()
        self.death_message = ""
        self._next = 0
        self._owner: weakref.WeakKeyDictionary[RequestHandle, Engine] = weakref.WeakKeyDictionary()

    @property
    def metrics(self) -> MetricsSink:
        return self.engines[0].metrics

    @property
    def scheduler(self) -> Scheduler:
        return self.engines[0].scheduler

    @property
    def state(self) -> EngineState:
        states = {e.state for e in self.engines}
        for state in (EngineState.DEAD, EngineState.HUNG, EngineState.STOPPED):
            if state in states:
                return state
        return EngineState.RUNNING

    @property
    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.engines)

    @property
    def steps(self) -> int:
        return sum(e.steps for e in self.engines)

    @property
    def load_seconds(self) -> float:
        return sum(e.load_seconds for e in self.engines) / len(self.engines)

    @property
    def last_output(self) -> float | None:
        outputs = [e.last_output for e in self.engines if e.last_output is not None]
        return max(outputs) if outputs else None

    @property
    def step_overhead_s(self) -> float:
        return self.engines[0].step_overhead_s

    @property
    def step_overhead_per_seq_s(self) -> float:
        return self.engines[0].step_overhead_per_seq_s

    @step_overhead_per_seq_s.setter
    def step_overhead_per_seq_s(self, value: float) -> None:
        for engine in self.engines:
            engine.step_overhead_per_seq_s = value

    def submit(self, *, prompt_tokens: int, max_tokens: int, ignore_eos: bool = False,
               prefixes: tuple[tuple[int, int], ...] = (), arrival: float | None = None, stream: bool = False,
               log_metrics: bool = True) -> RequestHandle:
        """Queue a request on the next rank in turn."""
        engine = self.engines[self._next % len(self.engines)]
        self._next += 1
        handle = engine.submit(prompt_tokens=prompt_tokens, max_tokens=max_tokens, ignore_eos=ignore_eos,
                               prefixes=prefixes, arrival=arrival, stream=stream, log_metrics=log_metrics)
        self._owner[handle] = engine
        return handle

    def abort(self, handle: RequestHandle) -> None:
        engine = self._owner.get(handle)
        if engine is not None:
            engine.abort(handle)

    def has_work(self) -> bool:
        """Any rank has a request running or queued."""
        return any(e.scheduler.has_work for e in self.engines)

    def hang(self, gauges: HangGauges = "zero") -> None:
        for engine in self.engines:
            engine.hang(gauges)

    def kill(self, message: str) -> None:
        if self.death_message:
            return
        self.death_message = message
        for engine in self.engines:
            engine.kill(message)
        self.died.set()

    def stop(self, message: str = "engine shut down") -> None:
        for engine in self.engines:
            engine.stop(message)

    async def wait_idle(self) -> None:
        """Return once no rank has a request in flight."""
        while self.in_flight:
            for engine in self.engines:
                await engine.wait_idle()

    async def run(self) -> None:
        """Every rank's loop; one rank's death kills the rest."""

        async def watch(engine: Engine) -> None:
            await engine.died.wait()
            self.kill(engine.death_message)

        watchers = [asyncio.create_task(watch(e)) for e in self.engines]
        try:
            await asyncio.gather(*(e.run() for e in self.engines))
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
