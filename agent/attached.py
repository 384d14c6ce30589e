"""An attached replica: an engine Pitstop did not start. It is probed and scraped, never started or stopped.

Not ours to restart, so a wedge verdict (``agent.progress``) only takes its readiness off; the first canary
that completes again puts it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

import httpx

from agent.config import ReplicaConfig
from agent.probes import engine_alive
from agent.progress import CanaryEvidence, Progress, ProgressWatch
from agent.states import ReplicaMachine, utc_now
from agent.wire import EngineSample, ProcessSample, ReplicaState, ReplicaStatus, engine_kind

S = ReplicaState


class AttachedReplica:
    """ATTACHED while ``/health`` answers 200, UNREACHABLE otherwise; probed every ``interval`` seconds."""

    managed = False
    pid: int | None = None

    def __init__(self, spec: ReplicaConfig, client: httpx.AsyncClient, interval: float,
                 *, wall: Callable[[], datetime] = utc_now, wedge_canaries: int = 2) -> None:
        self.spec = spec
        self.client = client
        self.interval = interval
        self.machine = ReplicaMachine(spec.name, S.UNREACHABLE, wall)
        self.engine: EngineSample | None = None
        self.process: ProcessSample | None = None
        self.canary_ttft: float | None = None
        self.canary_ok: bool | None = None
        self.canary_aborts_total = 0  # canaries cut at their deadline: aborted requests in the engine's counter
        self._stop = asyncio.Event()
        self.progress = ProgressWatch(needed=wedge_canaries)
        self.wedged = False

    @property
    def state(self) -> ReplicaState:
        return self.machine.state

    @property
    def model_name(self) -> str:
        return self.spec.model

    def canary_observed(self, evidence: CanaryEvidence) -> Progress:
        verdict = self.progress.observe(evidence)
        if verdict is Progress.WEDGED and not self.wedged:
            self.wedged = True
            self.machine.note("wedged", f"wedged: {self.progress.summary()}; readiness off until a canary completes")
        elif verdict is Progress.SERVING and self.wedged:
            self.wedged = False
            self.machine.note("wedged", "a canary completed again: readiness back on")
        return verdict

    def request_shutdown(self) -> None:
        self._stop.set()

    async def probe_once(self) -> None:
        alive = await engine_alive(self.client, self.spec.base_url, self.spec.probe_timeout, self.spec.adapter.probes)
        if alive and self.state == S.UNREACHABLE:
            self.machine.to(S.ATTACHED, "health 200")
        elif not alive and self.state == S.ATTACHED:
            self.machine.to(S.UNREACHABLE, "health probe failed")

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.probe_once()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval)
            except TimeoutError:
                continue

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(
            name=self.spec.name, model=self.spec.model, url=self.spec.base_url, state=self.state,
            ready=self.state == S.ATTACHED and not self.wedged, managed=False, gpus=self.spec.gpus,
            state_since=self.machine.since, engine=self.engine, process=self.process,
            canary_ttft_seconds=self.canary_ttft, canary_ok=self.canary_ok,
            engine_kind=engine_kind(self.spec.adapter.name))
