"""A simulated fleet for remediation tests: the real app on SQLite, a fake clock, and agents that converge.

``SimAgent`` stands in for ``pitstop agent``: it reports its replicas and, when told to converge, does what
the real agent does with the answer (a new generation -> READY with the new args; disabled -> STOPPED).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from agent.wire import (
    PROTOCOL_VERSION,
    DesiredState,
    EngineSample,
    EngineWindow,
    GpuSample,
    LiveLimits,
    NodeReport,
    ProcessSample,
    ReplicaEvent,
    ReplicaState,
    ReplicaStatus,
    WindowHistogram,
)
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.jobs import Jobs
from tests.controlplane.fixtures import T0, FakeClock
from tests.policy.windows import ITL_BOUNDS

GIB = 1024**3


@dataclass
class SimReplica:
    name: str
    model: str = "tiny-llama"
    state: ReplicaState = ReplicaState.READY
    generation: int = 1
    engine_args: list[str] = field(default_factory=lambda: ["--max-num-seqs", "64"])
    gpus: list[int] = field(default_factory=lambda: [0])
    running: float = 2.0
    waiting: float = 0.0
    tokens_total: float = 0.0
    tokens_per_second: float = 100.0
    requests_per_second: float = 2.0
    ttft: float = 0.12
    itl: float = 0.02
    # The median and p95 beside those p99s, when a test charts them (None: not read, as an older agent sends).
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    preemptions_per_second: float = 0.0
    preemptions_total: float = 0.0
    rss: int = 2 * GIB
    gpu_memory: int | None = None  # the engine's processes' GPU memory (None: the backend reads none)
    canary_ok: bool = True
    stalled: bool = False
    exit_code: int | None = None
    log_tail: list[str] = field(default_factory=lambda: ["INFO engine started"])
    restarts: int = 0
    # Its engine runs the live-cap plug-in (active), and the cap the agent last wrote (None: none).
    live: bool = False
    live_cap: int | None = None
    # Each report carries its scrape window's inter-token latency histogram, 20 engine steps a second of
    # ``running`` requests each, around the ITL p99 (a median of half of it).
    windows: bool = False
    rng: random.Random = field(default_factory=lambda: random.Random(1))

    def window(self, at: datetime, seconds: float) -> EngineWindow | None:
        if not self.windows or seconds <= 0:
            return None
        steps = int(20 * seconds)
        counts = [0.0] * (len(ITL_BOUNDS) + 1)
        for _ in range(steps):
            counts[bisect.bisect_left(ITL_BOUNDS, self.itl / 2 * self.rng.lognormvariate(0, 0.3))] += self.running
        return EngineWindow(ended_at=at, seconds=seconds, steps=steps,
                            itl=WindowHistogram(bounds=list(ITL_BOUNDS), counts=counts))

    def live_limits(self) -> LiveLimits | None:
        if not self.live:
            return None
        startup = int(self.engine_args[self.engine_args.index("--max-num-seqs") + 1])
        return LiveLimits(active=True, cap=self.live_cap or startup, requested=self.live_cap,
                          startup_limit=startup, asked=self.live_cap)

    def status(self, now_seconds: float, at: datetime = T0) -> ReplicaStatus:
        if not self.stalled:
            self.tokens_total += self.tokens_per_second * now_seconds
        self.preemptions_total += self.preemptions_per_second * now_seconds
        serving = self.state == ReplicaState.READY
        # state_since: before the fleet's clock starts (T0 - 30 min), as a real transition is never in the future.
        return ReplicaStatus(
            name=self.name, model=self.model, url="http://127.0.0.1:9001", state=self.state, ready=serving,
            gpus=self.gpus, generation=self.generation, engine_args=list(self.engine_args),
            restarts_total=self.restarts, state_since=T0 - timedelta(hours=1), last_exit_code=self.exit_code,
            log_tail=self.log_tail,
            engine=EngineSample(requests_running=self.running, requests_waiting=self.waiting,
                                generation_tokens_total=self.tokens_total,
                                generation_tokens_per_second=0.0 if self.stalled else self.tokens_per_second,
                                requests_per_second=self.requests_per_second, ttft_p99_seconds=self.ttft,
                                ttft_p50_seconds=self.ttft_p50, ttft_p95_seconds=self.ttft_p95,
                                itl_p50_seconds=self.itl_p50, itl_p95_seconds=self.itl_p95,
                                preemptions_total=self.preemptions_total,
                                preemptions_per_second=self.preemptions_per_second,
                                itl_p99_seconds=self.itl, window=self.window(at, now_seconds))
            if serving else None,
            live_cap=self.live_cap if self.live else None, live_limits=self.live_limits(),
            process=ProcessSample(pid=4242, rss_bytes=self.rss, num_processes=4, gpu_memory_bytes=self.gpu_memory),
            canary_ok=self.canary_ok if serving else None, canary_ttft_seconds=0.05 if serving else None,
        )


@dataclass
class SimAgent:
    node: str
    replicas: list[SimReplica]
    temperature: float | None = 60.0  # GPU 0's; None: the backend could not read it
    xid_total: int = 0
    last_xid: int | None = None
    sequence: int = 0
    desired: DesiredState | None = None
    memory_total: int | None = None  # the host's memory, as the real agent reports it
    # What the agent's py-spy step sends for a restart that asks for a stack dump (note line, then the dump).
    stack_dump: str = "captured by py-spy 0.4.3 at 2026-11-29T12:00:00+00:00 from pid 4242 on node sim\n\n" \
                      'Thread 4243 (active): "EngineCoreThread"\n    wait_for_step (vllm/v1/engine/core.py:412)'
    events: list[ReplicaEvent] = field(default_factory=list)
    sent_at: datetime = T0  # the time of its latest report, on the fleet's clock

    def replica(self, name: str) -> SimReplica:
        return next(r for r in self.replicas if r.name == name)

    def report(self, client: TestClient, clock: FakeClock, step: float) -> DesiredState:
        self.sequence += 1
        self.sent_at = clock()
        gpu = GpuSample(index=0, uuid="GPU-0000", name="NVIDIA H200", temperature_celsius=self.temperature,
                        slowdown_temperature_celsius=89.0, memory_used_bytes=70 * GIB, memory_total_bytes=141 * GIB,
                        xid_events_total=self.xid_total, last_xid=self.last_xid)
        # GPU 0 is the one that heats and logs XIDs; the others its replicas run on are listed as a real agent
        # lists every GPU of its host (a report's replicas are on GPUs it lists).
        others = sorted({i for r in self.replicas for i in r.gpus} - {0})
        gpus = [gpu] + [GpuSample(index=i, uuid=f"GPU-{i:04d}", name="NVIDIA H200", temperature_celsius=60.0,
                                  slowdown_temperature_celsius=89.0) for i in others]
        body = NodeReport(protocol_version=PROTOCOL_VERSION, node=self.node, hostname=f"{self.node}.example",
                          agent_version="0.1.0", agent_url=None, sent_at=self.sent_at, sequence=self.sequence,
                          memory_total_bytes=self.memory_total,
                          gpus=gpus, replicas=[r.status(step, self.sent_at) for r in self.replicas],
                          events=self.events)
        self.events = []
        response = client.post(f"/v1/agents/{self.node}/report", json=body.model_dump(mode="json"))
        assert response.status_code == 200, response.text
        self.desired = DesiredState.model_validate(response.json())
        return self.desired

    def converge(self) -> None:
        """Do what the agent does with the last answer: restart into a new generation, or stop."""
        assert self.desired is not None
        for spec in self.desired.replicas:
            r = self.replica(spec.name)
            if r.live:  # the agent writes the cap file; the engine takes it at its next step
                r.live_cap = spec.live_cap
            if not spec.enabled:
                r.state = ReplicaState.STOPPED
            elif spec.generation > r.generation:
                if spec.capture_stack:  # the real agent dumps the old engine before draining it
                    self.events.append(ReplicaEvent(replica=r.name, at=self.sent_at, kind="stack_dump",
                                                    message=self.stack_dump))
                r.generation, r.engine_args = spec.generation, list(spec.engine_args)
                r.state, r.stalled, r.canary_ok, r.exit_code = ReplicaState.READY, False, True, None
                r.restarts += 1
                r.tokens_total = 0.0


class Fleet:
    """The app under test, its clock and its agents; ``step`` reports, evaluates and executes once."""

    def __init__(self, client: TestClient, clock: FakeClock, agents: list[SimAgent]) -> None:
        self.client, self.clock, self.agents = client, clock, agents
        self.jobs: Jobs = client.app.state.jobs  # type: ignore[attr-defined]
        self.jobs.elect()

    def agent(self, node: str) -> SimAgent:
        return next(a for a in self.agents if a.node == node)

    def step(self, seconds: float = 10.0, *, converge: bool = False) -> None:
        self.clock.advance(seconds)
        for a in self.agents:
            a.report(self.client, self.clock, seconds)
        self.jobs.evaluate()
        self.jobs.execute()
        if converge:
            for a in self.agents:
                a.report(self.client, self.clock, 0.0)
                a.converge()

    def run(self, seconds: float, every: float = 10.0, *, converge: bool = False) -> None:
        for _ in range(int(seconds / every)):
            self.step(every, converge=converge)

    def actions(self, **params: Any) -> list[dict[str, Any]]:
        response = self.client.get("/v1/actions", params=params)
        assert response.status_code == 200, response.text
        rows: list[dict[str, Any]] = response.json()
        return rows

    def action(self, action_id: int) -> dict[str, Any]:
        got: dict[str, Any] = self.client.get(f"/v1/actions/{action_id}").json()
        return got


def server_config(tmp_path: Path, **overrides: Any) -> ServerConfig:
    # No duty cap: it paces rounds by the wall clock (a round slower than half a second delays the next), and
    # on a loaded machine it skipped rounds a test drives on its fake clock, so outcomes depended on the load.
    return ServerConfig(**{"database_url": f"sqlite:///{tmp_path / 'pitstop.db'}", "policy_max_duty": 1.0,
                           **overrides})


@contextmanager
def fleet(tmp_path: Path, agents: list[SimAgent], clock: FakeClock | None = None, **settings: Any) -> Iterator[Fleet]:
    clock = clock or FakeClock(T0 - timedelta(minutes=30))
    app = create_app(server_config(tmp_path, **settings), clock=clock, run_jobs=False)
    with TestClient(app) as client:
        f = Fleet(client, clock, agents)
        try:
            yield f
        finally:
            f.jobs.stop()  # gives up leadership (on PostgreSQL, the advisory lock) for the next app
