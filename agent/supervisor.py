"""Supervision of one managed replica: one asyncio task drives its state machine (see ``agent.states``).

The task reacts to three things only: the engine process exiting, a phase finishing (ready, warmed, drained,
backoff elapsed), and a change of what is wanted (a new desired generation, disabled, agent shutdown), which
sets ``wake``. Any exit the supervisor did not ask for is a failure whatever the exit code: vLLM's API server
exits 0 when its EngineCore dies (docs/design.md). A fourth comes from the agent's canaries: the verdict that
the engine is wedged (``agent.progress``), which takes readiness off at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import httpx

from agent.backoff import FailureWindow
from agent.config import BackoffConfig, ReplicaConfig
from agent.desired import Want
from agent.drain import drain
from agent.engine_proc import reap_if_dead, with_exit
from agent.event_journal import EventJournal
from agent.live_limits import LiveCap
from agent.phases import Outcome, first_of
from agent.probes import engine_ready, in_flight, served_model_name, stream_completion
from agent.process_tree import client_connections
from agent.progress import CanaryEvidence, Progress, ProgressWatch
from agent.runtime import Engine, ProcessRuntime, Runtime, StartRefused
from agent.stackdump import StackDumper
from agent.states import RUNNING_STATES, ReplicaMachine, utc_now
from agent.warmup import warmup_done, warmup_summary
from agent.wire import EngineSample, ProcessSample, ReplicaState, ReplicaStatus, engine_kind

log = logging.getLogger(__name__)
S = ReplicaState
T = TypeVar("T")


class ReplicaSupervisor:
    """Starts, warms, watches, drains and stops one engine replica."""

    managed = True

    def __init__(self, spec: ReplicaConfig, client: httpx.AsyncClient, state_dir: Path, backoff: BackoffConfig,
                 *, wall: Callable[[], datetime] = utc_now, mono: Callable[[], float] | None = None,
                 poll_interval: float = 0.5, extra_env: dict[str, str] | None = None,
                 dumper: StackDumper | None = None, wedge_canaries: int = 2,
                 runtime: Runtime | None = None) -> None:
        self.spec = spec
        self.dumper = dumper
        self.client = client
        # What starts and finds the engine (``agent.runtime``): a child process unless told otherwise.
        self.runtime = runtime or ProcessRuntime(spec.name, state_dir, spec.log_max_bytes, spec.log_backups)
        self.mono = mono or (lambda: asyncio.get_running_loop().time())
        self.poll_interval = poll_interval
        self.extra_env = extra_env or {}
        self.machine = ReplicaMachine(spec.name, S.STOPPED, wall,
                                      journal=EventJournal(state_dir / "run" / f"{spec.name}.events"))
        self.window = FailureWindow(backoff.max_failures, backoff.window, backoff.base, backoff.cap)
        self.want = Want(spec.enabled, 0, list(spec.args))
        self.generation = 0
        self.args = list(spec.args)
        self.proc: Engine | None = None
        self.restarts_total = 0
        self.last_exit_code: int | None = None
        self.log_tail: list[str] = []
        self.engine: EngineSample | None = None
        self.process: ProcessSample | None = None
        self.canary_ttft: float | None = None
        self.canary_ok: bool | None = None
        self.canary_aborts_total = 0  # canaries cut at their deadline: aborted requests in the engine's counter
        self.warmup_ttfts: list[float] = []
        self._backoff_until = 0.0
        self._wake = asyncio.Event()
        self._shutdown = False
        self.cordoned = False
        self.gpu_cordoned: frozenset[int] = frozenset()  # the cordoned GPUs this replica uses
        self._dumped_for: int | None = None
        # Set once what a previous agent left has been looked for (adopted or ended): until then an engine about to
        # be adopted is on the GPU and nobody's, and the orphan check waits (``agent.node``).
        self.looked_for_leftovers = False
        self.progress = ProgressWatch(needed=wedge_canaries)
        self._wedged_because: str | None = None
        self.in_flight_at_wedge: int | None = None
        self.live = (LiveCap(state_dir / "run" / f"{spec.name}.live_cap", self.machine.note) if spec.live_limits
                     else None)

    # ---- what is wanted -------------------------------------------------------------------------------
    def set_want(self, want: Want) -> None:
        if want.live_cap != self.want.live_cap:
            if self.live is not None:
                self.live.ask(want.live_cap)
            else:
                self.machine.note("live_cap", f"live cap {want.live_cap or 'none'} asked for, but live_limits is off "
                                              "for this replica: only a restart with new engine args changes its limit")
        self.want = want
        self._wake.set()

    def set_cordoned(self, cordoned: bool) -> None:
        """A cordoned node starts nothing and drains what runs; uncordoned, it converges back to ``want``."""
        if cordoned != self.cordoned:
            self.cordoned = cordoned
            self.machine.note("cordon", "node cordoned: draining" if cordoned else "node uncordoned")
            self._wake.set()

    def set_gpu_cordoned(self, cordoned_gpus: frozenset[int]) -> None:
        """Like a node cordon, for the replicas on a cordoned GPU only: drain, stay stopped, converge back."""
        mine = frozenset(cordoned_gpus & set(self.spec.gpus))
        if mine != self.gpu_cordoned:
            listed = ", ".join(str(g) for g in sorted(mine or self.gpu_cordoned))
            self.machine.note("cordon", f"GPU {listed} cordoned: draining" if mine else f"GPU {listed} uncordoned")
            self.gpu_cordoned = mine
            self._wake.set()

    def canary_observed(self, evidence: CanaryEvidence) -> Progress:
        """Take one canary's evidence; a WEDGED verdict on a READY replica wakes the task to take it out."""
        verdict = self.progress.observe(evidence)
        if verdict is Progress.WEDGED and self.state == S.READY and self._wedged_because is None:
            if self.proc is None or self.proc.gone:
                # A dead engine refuses the canary at once, often before its exit is reaped: a crash, which the
                # exit path reports (READY -> BACKOFF), not a wedge. A wedged engine is alive and accepts.
                return verdict
            # The canary's own connection is closed by now; the gauges' last live count is a floor where
            # connections cannot be read.
            connections = client_connections(self.proc.pid, self.spec.port or 0)
            self.in_flight_at_wedge = max(connections or 0, int(self.progress.in_flight_when_live or 0))
            self._wedged_because = self.progress.wedged_reason(self.in_flight_at_wedge, connections)
            self._wake.set()
        return verdict

    def request_shutdown(self) -> None:
        self._shutdown = True
        self._wake.set()

    def _want_running(self) -> bool:
        return self.want.enabled and not self._shutdown and not self.cordoned and not self.gpu_cordoned

    def _interrupted(self) -> bool:
        """The running engine is no longer what is wanted."""
        return not self._want_running() or self.want.generation != self.generation

    # ---- status -----------------------------------------------------------------------------------------
    @property
    def state(self) -> ReplicaState:
        return self.machine.state

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.state in RUNNING_STATES | {S.STOPPING} else None

    @property
    def model_name(self) -> str:
        return served_model_name(self.spec.model, self.args, self.spec.adapter.served_name_flag)

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(
            name=self.spec.name, model=self.spec.model, url=self.spec.base_url, state=self.state,
            ready=self.state == S.READY, managed=True, gpus=self.spec.gpus, generation=self.generation,
            engine_args=self.args, restarts_total=self.restarts_total, state_since=self.machine.since,
            last_exit_code=self.last_exit_code, log_tail=self.log_tail[-200:], engine=self.engine,
            process=self.process, canary_ttft_seconds=self.canary_ttft, canary_ok=self.canary_ok,
            requests_in_flight_at_wedge=self.in_flight_at_wedge if self.state == S.WEDGED else None,
            engine_kind=engine_kind(self.spec.adapter.name),
            **(self.live.status(self.generation) if self.live is not None and self.state in RUNNING_STATES else {}))

    # ---- the task ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Drive the state machine until shutdown; the engine is stopped on the way out, whatever happens."""
        try:
            await self._take_over_leftover()
            while not (self._shutdown and self.state in (S.STOPPED, S.FATAL)):
                state = self.state
                if state == S.STOPPED:
                    if self._want_running():
                        await self._start()
                    else:
                        await self._phase(None, None)
                elif state == S.READY:
                    await self._serve()
                elif state == S.WEDGED:
                    await self._wedged()
                elif state == S.BACKOFF:
                    await self._backoff()
                elif state == S.FATAL:
                    await self._fatal()
                else:  # only the phases above leave the machine between iterations
                    raise RuntimeError(f"replica {self.spec.name}: unexpected resting state {state}")
        finally:
            if self.proc is not None:
                await self.proc.kill()
                self.proc = None
                self.runtime.forget()

    async def _take_over_leftover(self) -> None:
        """Adopt the engine a previous agent left (``agent.adopted``, ``agent.containers``), judged from STARTING
        as a new one is: kept when it runs the wanted generation, drained and stopped when not. What is left and
        not adopted (an older agent's record with no generation, a container of an older generation) is ended."""
        try:
            _, found = await self._while(self.runtime.take_over(), lambda: not self._shutdown)
        except StartRefused as exc:  # the runtime cannot be asked (a container daemon down): nothing to adopt
            self.machine.note("orphan", f"cannot look for an engine left by a previous agent: {exc}")
            log.warning("replica %s: cannot look for an engine left by a previous agent: %s", self.spec.name, exc)
            found = None
        await self._end_leftovers()
        if found is None:
            self.looked_for_leftovers = True
            return
        self.proc = found.engine
        self.looked_for_leftovers = True
        self.generation, self.args = found.generation, list(found.args)
        if self.live is not None:
            self.live.adopted(self.want.live_cap)
        self.machine.to(S.STARTING, f"adopted {found.what} (generation {found.generation}) left by a previous agent")
        log.warning("replica %s: adopted %s left by a previous agent", self.spec.name, found.what)
        if self._interrupted():
            await self._drain_and_stop()
        elif await self._until_ready() and await self._warm():
            self.machine.to(S.READY, warmup_summary(self.warmup_ttfts, self.spec.warmup))

    async def _end_leftovers(self) -> None:
        try:
            _, ended = await self._while(self.runtime.end_leftovers(self.spec.stop_timeout), lambda: not self._shutdown)
        except StartRefused as exc:
            log.warning("replica %s: cannot end what a previous agent left: %s", self.spec.name, exc)
            return
        for gone in ended or []:
            self.machine.note("orphan", f"ended {gone.what} left by a previous agent")
            log.warning("replica %s: ended %s left by a previous agent", self.spec.name, gone.what)
            self.log_tail = gone.last_words

    async def _phase(self, work: Awaitable[T] | None, limit: float | None) -> tuple[Outcome, T | None]:
        """Wait for ``work``, the engine's exit, or a wake-up, whichever comes first (``agent.phases``)."""
        return await first_of(work, self.proc.exited() if self.proc is not None else None, self._wake, limit)

    async def _start(self) -> None:
        if self.state in (S.BACKOFF, S.FATAL) and self.want.generation == self.generation:
            self.restarts_total += 1
        self.generation, self.args = self.want.generation, list(self.want.args)
        self.progress.reset()  # a new process has to prove itself again
        self._wedged_because = None
        self.in_flight_at_wedge = None
        # The last canary was the old process's: reported on through the new one's start, a wedged engine's
        # failed canary read as the new engine failing its canaries (and restarted it once it was READY).
        self.canary_ok = self.canary_ttft = None
        argv = self.spec.argv(self.args)
        self.machine.to(S.STARTING, f"generation {self.generation}: {' '.join(argv)}")
        env = self.runtime.environment({**self.extra_env, **self.spec.env,
                                        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.spec.gpus)})
        if self.live is not None:
            env = self.live.starting(self.want.live_cap, env)
        if await self._launch(argv, env) and await self._until_ready() and await self._warm():
            self.machine.to(S.READY, warmup_summary(self.warmup_ttfts, self.spec.warmup))

    async def _launch(self, argv: list[str], env: dict[str, str]) -> bool:
        """Have the runtime start the engine: cancelled by a wish that no longer wants it (``_while``)."""
        try:
            finished, engine = await self._while(self.runtime.start(argv, env, self.generation, self.args),
                                                 lambda: not self._interrupted())
        except StartRefused as exc:
            await self._failed(str(exc))
            return False
        if not finished or engine is None:
            await self._stop("start interrupted")
            return False
        self.proc = engine
        return True

    async def _while(self, call: Awaitable[T], still: Callable[[], bool]) -> tuple[bool, T | None]:
        """(whether it finished, its result) of a call to the runtime, awaited as a phase. A runtime's call can take
        minutes (a container's image pulled first, a daemon that does not answer), so a wake-up after which
        ``still()`` is false (agent shutdown, disabled, another generation) cancels it; any other lets it go on."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                if not still():  # asked before waiting: a wish that came while busy elsewhere cleared ``wake``
                    return False, None
                outcome, result = await self._phase(asyncio.shield(task), None)
                if outcome == "done":
                    return True, result
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, StartRefused):
                    await task

    async def _until_ready(self) -> bool:
        deadline = self.mono() + self.spec.start_timeout
        while True:
            if self._interrupted():
                await self._stop("start interrupted")
                return False
            remaining = deadline - self.mono()
            if remaining <= 0:
                await self._failed(f"not ready within start_timeout {self.spec.start_timeout:g}s")
                return False
            probe = engine_ready(self.client, self.spec.base_url, self.model_name, self.spec.probe_timeout,
                                 self.spec.adapter.probes)
            outcome, ready = await self._phase(probe, remaining)
            if outcome == "exit":
                await self._failed("engine exited while starting")
                return False
            if outcome == "done" and ready:
                self.machine.to(S.WARMING, "health 200 and model listed")
                return True
            if outcome == "done":
                await self._phase(asyncio.sleep(min(self.poll_interval, max(0.0, remaining))), None)

    async def _warm(self) -> bool:
        warmup = self.spec.warmup
        ttfts: list[float] = []
        while not warmup_done(ttfts, warmup):
            if self._interrupted():
                await self._stop("warmup interrupted")
                return False
            request = stream_completion(self.client, self.spec.base_url, self.model_name, warmup.prompt,
                                        warmup.max_tokens, warmup.timeout, self.mono)
            outcome, result = await self._phase(request, warmup.timeout + 1.0)
            if outcome == "exit":
                await self._failed("engine exited while warming up")
                return False
            if outcome == "wake":
                continue  # the loop head decides whether the wish still allows warming up
            if outcome == "timeout" or result is None or not result.ok:
                error = result.error if result is not None else "timed out"
                await self._failed(f"warmup request {len(ttfts) + 1} failed: {error}")
                return False
            ttfts.append(result.ttft_seconds if result.ttft_seconds is not None else warmup.timeout)
        self.warmup_ttfts = ttfts
        return True

    async def _serve(self) -> None:
        # Check before waiting: a wish that arrived while we were busy elsewhere already cleared ``wake``.
        outcome = "wake" if self._interrupted() or self._wedged_because else (await self._phase(None, None))[0]
        if outcome == "exit":
            await self._failed("engine exited while serving")
        elif self._interrupted():
            await self._capture_stack()
            await self._drain_and_stop()
        elif self._wedged_because is not None:
            log.warning("replica %s: %s", self.spec.name, self._wedged_because)
            self.machine.to(S.WEDGED, self._wedged_because)

    async def _wedged(self) -> None:
        """Out of rotation, process kept (its stacks are the evidence), until the next wish ends it."""
        outcome = "wake" if self._interrupted() else (await self._phase(None, None))[0]
        if outcome == "exit":
            await self._failed("engine exited while wedged")
        elif self._interrupted():
            await self._capture_stack()
            # No drain: a frozen engine finishes nothing, and its gauges may read 0 or stay up for good. Killed at
            # once: a SIGTERM would only wait out its shutdown timeout, and its stacks are taken already.
            await self._stop("wedged: killed without a drain", grace=0.0)

    async def _capture_stack(self) -> None:
        """Before leaving a generation whose restart asks for it, keep the engine's stacks (one dump)."""
        want = self.want
        if (self.dumper is None or not want.capture_stack or want.generation <= self.generation
                or self._dumped_for == want.generation or self.proc is None or self.proc.returncode is not None):
            return
        self._dumped_for = want.generation
        dump = await self.dumper.dump(self.proc.pid, self.spec.adapter.core_process)
        log.info("replica %s: %s", self.spec.name, dump.note)
        self.machine.note("stack_dump", dump.message)

    async def _drain_and_stop(self) -> None:
        self.machine.to(S.DRAINING, "readiness off; waiting for in-flight requests")
        spec = self.spec
        end = await drain(self._phase, lambda: in_flight(self.client, spec.base_url, self.model_name,
                                                         spec.probe_timeout, spec.adapter),
                          self.mono, grace=spec.drain_grace, within=spec.drain_timeout,
                          poll_interval=self.poll_interval)
        if end == "exit":
            await self._reap("engine exited while draining")
            self.machine.to(S.STOPPED, "exited during drain")
        else:
            await self._stop("drained" if end == "drained" else "drain deadline passed")

    async def _stop(self, reason: str, grace: float | None = None) -> None:
        self.machine.to(S.STOPPING, reason)
        if self.proc is not None:
            self.last_exit_code = await self.proc.stop(self.spec.stop_timeout if grace is None else grace)
            self.proc = None
            self.runtime.forget()
        self.machine.to(S.STOPPED, f"stopped (exit code {self.last_exit_code})")

    async def _reap(self, reason: str) -> None:
        if self.proc is None:
            return
        code = await self.proc.wait()
        await self.proc.kill()  # the leader is gone; its children must not outlive it
        self.last_exit_code = code
        self.log_tail = await self.proc.last_words()  # read after the engine is gone: its very last words too
        self.proc = None
        self.runtime.forget()
        self.machine.note("exit", f"{reason} (exit code {code})")

    async def _failed(self, reason: str) -> None:
        proc = self.proc
        died = proc is not None and await reap_if_dead(proc)
        if proc is not None and proc.returncode is None:
            await proc.kill()
        await self._reap(reason)
        if died and proc is not None:  # of itself: say how (a SIGKILL is most often the OOM killer's)
            reason = with_exit(reason, proc)
        delay = self.window.record(self.mono())
        if delay is None:
            self.machine.to(S.BACKOFF, reason)
            self.machine.to(S.FATAL, f"{self.window.recent} failures within {self.window.window:g}s")
            log.error("replica %s is FATAL: %s", self.spec.name, reason)
            return
        self._backoff_until = self.mono() + delay
        self.machine.to(S.BACKOFF, f"{reason}; restart in {delay:g}s")
        log.warning("replica %s failed: %s; restarting in %gs", self.spec.name, reason, delay)

    async def _backoff(self) -> None:
        remaining = self._backoff_until - self.mono()
        if remaining > 0:
            await self._phase(asyncio.sleep(remaining), remaining + 1.0)
            if self._want_running() and self.mono() < self._backoff_until \
                    and self.want.generation == self.generation:
                return  # woken for nothing that matters here: keep waiting
        if not self._want_running():
            self.machine.to(S.STOPPED, "stopped while backing off")
        else:
            await self._start()

    async def _fatal(self) -> None:
        if self._want_running() and self.want.generation == self.generation:
            await self._phase(None, None)
        if not self._want_running():
            self.machine.to(S.STOPPED, "stopped while FATAL")
        elif self.want.generation != self.generation:
            self.window.reset()
            await self._start()
