"""The running agent: replica supervisors, the collector, the reporter and the HTTP API in one asyncio loop.

Task layout (one ``TaskGroup``): one task per replica (``ReplicaSupervisor.run`` or ``AttachedReplica.run``),
one collector (GPU read, engine scrapes, process trees, canaries every ``scrape_interval``), one reporter
(every ``report_interval``, or what the control plane asks), and uvicorn. When ``stop`` is set every managed
replica drains and stops before the agent returns; if any task fails, the group cancels the others and each
supervisor still kills its engine's process group on the way out, so no engine outlives the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Callable
from datetime import datetime

import httpx
import psutil
from prometheus_client import CollectorRegistry, ProcessCollector

from agent.api import EmbeddedServer, create_app, server_config
from agent.attached import AttachedReplica
from agent.backlog import Backlog
from agent.canaries import Canaries
from agent.cgroup_memory import cgroup_memory
from agent.config import AgentConfig
from agent.containers import ContainerRuntime
from agent.desired import DesiredStore, plan_wants
from agent.docker_api import DockerApi
from agent.exporter import AgentCollector, ExportState
from agent.gpu import GpuBackend
from agent.gpu.xid import XidLedger
from agent.orphans import Orphan, OrphanWatch
from agent.process_tree import ProcessTreeSampler
from agent.reporter import Reporter, ReportError
from agent.retry import report_wait
from agent.scrape import EngineScraper
from agent.stackdump import StackDumper, find_py_spy
from agent.states import utc_now
from agent.supervisor import ReplicaSupervisor
from agent.ticks import until_tick
from agent.wire import (
    PROTOCOL_VERSION,
    DesiredState,
    GpuSample,
    NodeReport,
    ReplicaEvent,
    ReplicaState,
    ReplicaStatus,
)
from pitstop import __version__

log = logging.getLogger(__name__)
S = ReplicaState
Replica = ReplicaSupervisor | AttachedReplica

# States in which the engine answers HTTP and its /metrics mean something.
# A WEDGED engine is scraped too: its flat counters are the evidence the control plane restarts it on.
SCRAPE_STATES = frozenset({S.WARMING, S.READY, S.WEDGED, S.DRAINING, S.ATTACHED})
MAX_REPORT_EVENTS = 1000


class Agent:
    def __init__(self, config: AgentConfig, client: httpx.AsyncClient, gpu: GpuBackend, *,
                 wall: Callable[[], datetime] = utc_now, poll_interval: float = 0.5,
                 scrape_client: httpx.AsyncClient | None = None,
                 report_client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.node = config.node
        self.client = client
        self.gpu = gpu
        self.wall = wall
        self.state_dir = config.resolved_state_dir
        self.host_memory_bytes = int(psutil.virtual_memory().total)
        self.replicas: dict[str, Replica] = {}
        dumper = StackDumper(find_py_spy(config.py_spy), self.node, timeout=config.stack_dump_timeout, wall=wall)
        # One client of the container daemon for every replica in a container (``agent.containers``).
        self.docker = (DockerApi(config.docker_host) if any(s.runtime == "container" for s in config.replicas)
                       else None)
        for spec in config.replicas:
            if spec.managed:
                runtime = (ContainerRuntime(self.docker, self.node, spec, config.container_gpus)
                           if self.docker is not None and spec.runtime == "container" else None)
                self.replicas[spec.name] = ReplicaSupervisor(spec, client, self.state_dir, config.backoff,
                                                             wall=wall, poll_interval=poll_interval,
                                                             extra_env=config.engine_env(spec, os.environ),
                                                             dumper=dumper,
                                                             wedge_canaries=config.wedge_canaries,
                                                             runtime=runtime)
            else:
                self.replicas[spec.name] = AttachedReplica(spec, client, config.scrape_interval, wall=wall,
                                                           wedge_canaries=config.wedge_canaries)
        # Engines are read through the lean loopback transport (``agent.plain_http``), scrapes and the
        # pass-through of /engines/<name>/metrics alike.
        self.scrape_client = scrape_client or client
        self.scrapers = {name: EngineScraper(self.scrape_client, r.spec.base_url, r.model_name, _loop_time,
                                             timeout=max(10.0, r.spec.probe_timeout), engine=r.spec.adapter)
                         for name, r in self.replicas.items()}
        self.samplers = {name: ProcessTreeSampler() for name in self.replicas}
        self.gpus: list[GpuSample] = []
        # Every XID code read, counted per code for /metrics and kept until a report delivers it.
        self.xid_ledger = XidLedger()
        self.sequence = 0
        self.backlog = Backlog(self.node, config.report_backlog_seconds)
        self._outage = False  # a report failed since the backlog was last empty
        self._delivered = 0  # the sequence of the last delivered live report
        self.desired_store = DesiredStore(self.state_dir)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentCollector(self.export_state))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        self.reporter = (Reporter(report_client or client, config.control_plane, self.node, config.token, wall=wall)
                         if config.control_plane else None)
        self.canaries = Canaries(config, self.scrape_client, {n: s.url for n, s in self.scrapers.items()})
        self._saved_desired: DesiredState | None = None
        self.cordoned = False
        self.cordoned_gpus: frozenset[int] = frozenset()
        self._sampled_pid: dict[str, int | None] = {}
        self._process_due: dict[str, float] = {}
        self.orphans = OrphanWatch(kill=config.kill_orphans)
        self._orphans_checked_at: float | None = None
        self.bound_port: int | None = None
        # Retry jitter: seeded per agent so a fleet restarted at once does not retry in step.
        self._rng = random.Random()
        self._pass_done = asyncio.Event()  # set at the end of every collection pass
        # Each replica's reading in flight: one engine that does not answer (a frozen API server holds its scrape
        # to the timeout) never holds back another's, nor the pass, and is never read twice at once.
        self._collecting: dict[str, asyncio.Task[None]] = {}

    # ---- views ------------------------------------------------------------------------------------------
    def statuses(self) -> list[ReplicaStatus]:
        return [r.status() for r in self.replicas.values()]

    def status_of(self, name: str) -> ReplicaStatus | None:
        replica = self.replicas.get(name)
        return None if replica is None else replica.status()

    def export_state(self) -> ExportState:
        return ExportState(node=self.node, gpus=list(self.gpus), replicas=self.statuses(), cordoned=self.cordoned,
                           cordoned_gpus=sorted(self.cordoned_gpus),
                           orphans=self.orphans.per_gpu(), xid_counts=self.xid_ledger.counts,
                           scrape_errors={n: s.errors_total for n, s in self.scrapers.items()},
                           canary_aborts={n: r.canary_aborts_total for n, r in self.replicas.items()},
                           backlog=len(self.backlog), backlog_kept=self.backlog.kept_total,
                           backlog_sent=self.backlog.sent_total,
                           backlog_dropped=self.backlog.dropped_total,
                           backlog_refused=self.backlog.refused_total)

    # ---- desired state ----------------------------------------------------------------------------------
    def apply_desired(self, desired: DesiredState) -> None:
        managed = {n: r for n, r in self.replicas.items() if isinstance(r, ReplicaSupervisor)}
        if desired.cordoned != self.cordoned:
            log.info("node %s %s", self.node, "cordoned: draining every replica" if desired.cordoned else
                     "uncordoned")
            self.cordoned = desired.cordoned
        gpus = frozenset(desired.cordoned_gpus)
        if gpus != self.cordoned_gpus:
            log.info("node %s: cordoned GPUs now %s", self.node, sorted(gpus) or "none")
            self.cordoned_gpus = gpus
        for replica in managed.values():
            replica.set_cordoned(self.cordoned)
            replica.set_gpu_cordoned(self.cordoned_gpus)
        for name, want in plan_wants(desired, {n: r.want for n, r in managed.items()}).items():
            now = managed[name].want
            if (want.generation, want.enabled) != (now.generation, now.enabled):
                log.info("replica %s: desired generation %d (enabled=%s, args=%s)", name, want.generation,
                         want.enabled, want.args)
                managed[name].machine.note("desired", f"generation {want.generation}, enabled={want.enabled}, "
                                                      f"args={want.args}")
            managed[name].set_want(want)  # a live cap alone is said by the replica itself

    # ---- collection -------------------------------------------------------------------------------------
    async def collect_once(self) -> None:
        reading = await asyncio.to_thread(self.gpu.read)  # NVML calls block
        self.gpus = reading.gpus
        for gpu in reading.gpus:
            self.xid_ledger.observe(gpu.index, gpu.xids)
        started = []
        for name, replica in self.replicas.items():
            running = self._collecting.get(name)
            if running is not None:
                if not running.done():
                    # Still reading this engine from an earlier pass: its figures land when it answers. Until
                    # then the report says so rather than repeat the last figures (``EngineScraper.overdue``).
                    replica.engine = self.scrapers[name].overdue() or replica.engine
                    continue
                running.result()  # a reading that raised fails the pass, as it would have in it
            task = asyncio.create_task(self._collect_replica(name, replica, reading.process_memory,
                                                             self.canaries.due(name)), name=f"collect-{name}")
            self._collecting[name] = task
            started.append(task)
        if started:
            # The pass (and the report that follows it) waits for the engines that answer: half an interval at
            # most, then it goes on with the others' fresh figures and the slow one's last.
            done, _ = await asyncio.wait(started, timeout=self.config.scrape_interval / 2)
            for task in done:
                task.result()
        now = _loop_time()
        # Not before every replica has looked for the engine a previous agent left: one about to be adopted is on
        # its GPU and nobody's for that moment, and would be reported (or, with kill_orphans, ended) as an orphan.
        looked = all(r.looked_for_leftovers for r in self.replicas.values() if isinstance(r, ReplicaSupervisor))
        if looked and (self._orphans_checked_at is None
                       or now - self._orphans_checked_at >= self.config.orphan_check_interval):
            self._orphans_checked_at = now
            self.check_orphans(reading.gpu_processes)

    def check_orphans(self, gpu_processes: dict[int, dict[int, int]]) -> list[Orphan]:
        """Report (and, if configured, end) processes on our GPUs that no managed replica started."""
        managed = [r for r in self.replicas.values() if isinstance(r, ReplicaSupervisor)]
        roots = {r.pid for r in managed if r.pid is not None}
        owned = set(roots).union(*(self.samplers[r.spec.name].pids for r in managed))
        new = self.orphans.check(gpu_processes, owned, roots)
        for orphan in new:
            message = (f"pid {orphan.pid} holds {orphan.memory_bytes / 2**20:.0f} MiB on GPU {orphan.gpu} and was "
                       f"not started by this agent: {orphan.command}")
            log.warning("orphan: %s", message)
            owner = self._replica_on_gpu(orphan.gpu)
            if owner is not None:
                owner.machine.note("orphan", message)
        for pid in self.orphans.end():
            log.warning("kill_orphans: signalled orphan pid %d", pid)
        return new

    def _replica_on_gpu(self, gpu: int) -> Replica | None:
        on_gpu = [r for r in self.replicas.values() if gpu in r.spec.gpus]
        return on_gpu[0] if on_gpu else next(iter(self.replicas.values()), None)

    async def _collect_replica(self, name: str, replica: Replica, gpu_memory: dict[int, int],
                               canary: bool) -> None:
        scraper = self.scrapers[name]
        # The canary goes with the scrape, not after it: its "before" is the counter the scrape reads, and a
        # frozen API server, which holds the scrape to its timeout, must not hold the canary too.
        before: asyncio.Future[float | None] | None = None
        if canary and self.canaries.wanted(replica):
            if replica.state in SCRAPE_STATES:
                before = asyncio.get_running_loop().create_future()
            self.canaries.start(replica, before)
        try:
            if replica.state in SCRAPE_STATES:
                was_stalled = scraper.last.stalled if scraper.last is not None else None
                replica.engine = engine = await scraper.scrape(own_aborts=replica.canary_aborts_total)
                if before is not None:
                    before.set_result(engine.generation_tokens_total if engine.scrape_error is None else None)
                replica.progress.engine_scraped(engine)  # what a wedge would take with it
                if engine.stalled and not was_stalled:
                    replica.machine.note("stall", "requests queued or running, generation tokens not moving")
            else:
                scraper.forget()
                replica.engine = None
        finally:
            if before is not None and not before.done():
                before.set_result(None)  # the reading was abandoned (the agent stopping)
        if not replica.managed:
            replica.process = None
        elif replica.pid != self._sampled_pid.get(name) or _loop_time() >= self._process_due.get(name, 0.0):
            # Trees change slowly and leaks over minutes: every process_interval, or at once for a new engine.
            replica.process = self.samplers[name].sample(replica.pid, gpu_memory)
            if replica.spec.runtime == "container" and replica.pid is not None:
                charged = cgroup_memory(replica.pid)
                if charged is not None:
                    replica.process = replica.process.model_copy(update={
                        "cgroup_memory_bytes": charged.usage_bytes, "cgroup_memory_limit_bytes": charged.limit_bytes})
            self._sampled_pid[name] = replica.pid
            self._process_due[name] = _loop_time() + self.config.process_interval

    async def _collect_loop(self, stop: asyncio.Event) -> None:
        # On the ticks of the interval (agent.ticks): the same wakeup as every engine's log check at the defaults,
        # and no drift of the pass's own length added to every interval.
        try:
            while not stop.is_set():
                await self.collect_once()
                self._pass_done.set()  # the reporter's cue (``_until_next_report``)
                await _wait(stop, until_tick(_loop_time(), self.config.scrape_interval))
        finally:
            self._pass_done.set()  # no more passes: a reporter waiting for one goes on at once
            for task in self._collecting.values():
                task.cancel()

    # ---- reporting --------------------------------------------------------------------------------------
    def build_report(self) -> NodeReport:
        events: list[ReplicaEvent] = []
        for replica in self.replicas.values():
            events.extend(replica.machine.drain_events())
        events.sort(key=lambda e: e.at)
        self.sequence += 1
        # A GPU's XIDs in a report: every code read since the last delivered report (not only the last read's).
        xids = self.xid_ledger.take()
        listed = {g.index for g in self.gpus}
        self.xid_ledger.requeue({i: codes for i, codes in xids.items() if i not in listed})  # for when it is back
        return NodeReport(
            protocol_version=PROTOCOL_VERSION, node=self.node, hostname=socket.gethostname(),
            agent_version=__version__, agent_url=f"http://{self.config.host}:{self.bound_port or self.config.port}",
            memory_total_bytes=self.host_memory_bytes,
            sent_at=self.wall(), sequence=self.sequence, replicas=self.statuses(),
            gpus=[self._reported_gpu(g, xids.get(g.index, [])) for g in self.gpus],
            events=events[-MAX_REPORT_EVENTS:])

    def _reported_gpu(self, gpu: GpuSample, xids: list[int]) -> GpuSample:
        """A GPU as a report carries it: fenced or not, with the XIDs read since the last delivered report."""
        cordoned = gpu.index in self.cordoned_gpus
        if not cordoned and xids == gpu.xids:
            return gpu
        return gpu.model_copy(update={"cordoned": cordoned, "xids": xids})

    def _requeue(self, report: NodeReport, refused: bool = False) -> None:
        for name, replica in self.replicas.items():
            replica.machine.requeue([e for e in report.events if e.replica == name])
        xids = {g.index: g.xids for g in report.gpus if g.xids}
        if refused and xids:
            # A control plane that predates ``xids`` refuses every report carrying them: drop them rather than
            # stop reporting (it still reads xid_events_total and last_xid).
            log.warning("control plane refused a report with XID codes %s; sending them no more", xids)
        else:
            self.xid_ledger.requeue(xids)

    async def report_once(self) -> DesiredState:
        """Send one report; apply and persist the answer. Raises ``ReportError`` (events are kept)."""
        assert self.reporter is not None
        report = self.build_report()
        try:
            desired = await self.reporter.send(report)
            self._delivered = report.sequence
        except ReportError as exc:
            self._requeue(report, refused=exc.refused_content)
            self.sequence = exc.sequence_past(self.sequence)  # a 409: the next report numbered past the control plane's
            if exc.readings_kept:
                self.backlog.keep_report(report)
            raise
        if desired != self._saved_desired:  # the same answer every second: write it once
            self.desired_store.save(desired)
            self._saved_desired = desired
        self.apply_desired(desired)
        return desired

    async def _report_loop(self, stop: asyncio.Event) -> None:
        failures = 0
        failing = None
        interval = self.config.report_interval
        while self.reporter is not None and not stop.is_set():
            started = _loop_time()
            try:
                desired = await self._report_keeping(interval)
            except ReportError as exc:
                if failures == 0 or exc.kind != failing:  # once per outage (and per cause), not once per attempt
                    log.warning("%s; supervising on the last desired state%s", exc.summary,
                                "; keeping a reading every report interval to send when it answers"
                                if self.backlog.enabled and exc.readings_kept else "")
                    failing = exc.kind
                failures += 1
                self._outage = True
                retry_at = _loop_time() + report_wait(failures, interval, exc.retry_after, self._rng)
                await self._keep_readings(stop, retry_at, interval, keep=exc.readings_kept)
                continue
            if failures:
                log.info("control plane reachable again after %d failed reports", failures)
            failures, failing = 0, None
            interval = desired.report_interval_seconds or self.config.report_interval
            if len(self.backlog) and not stop.is_set():
                await self._send_backlog()
            # Due an interval after this report began, but never sooner than half an interval after a slow control
            # plane answered it: a struggling one is not sent reports back to back.
            await self._until_next_report(stop, max(started + interval, _loop_time() + interval / 2))

    def _keep_reading(self) -> None:
        """Take a reading into the backlog now; its events and XIDs wait for the next live report."""
        report = self.build_report()
        self._requeue(report)
        self.backlog.keep_report(report)

    async def _report_keeping(self, interval: float) -> DesiredState:
        """``report_once``, taking a reading into the backlog every ``interval`` while it is in flight past one: a
        black-holed link holds each attempt until its timeout (10 s), and a reading is due every interval."""
        attempt = asyncio.ensure_future(self.report_once())
        while True:
            done, _ = await asyncio.wait({attempt}, timeout=interval)
            if done:
                return attempt.result()
            if self.backlog.enabled:
                self._keep_reading()

    async def _keep_readings(self, stop: asyncio.Event, until: float, interval: float, keep: bool) -> None:
        """Wait until ``until`` (the next attempt, a loop time), taking a reading into the backlog every report
        interval meanwhile: a retry backing off to a minute must not thin the node's history to one a minute."""
        while not stop.is_set():
            due = _loop_time() + interval
            if not keep or not self.backlog.enabled or due >= until:
                await _wait(stop, max(0.0, until - _loop_time()))
                return
            await self._until_next_report(stop, due)
            if not stop.is_set():
                self._keep_reading()

    async def _send_backlog(self) -> None:
        """Send the oldest kept readings, one batch (a minute of them at 1 s), after a delivered live report: a
        control plane back from an outage gets every agent's live report first, and the past at most one batch
        per agent per interval after it."""
        assert self.reporter is not None
        batch = self.backlog.batch(through=self._delivered)
        if batch is None:
            return
        count, body = batch
        try:
            answer = await self.reporter.send_readings(body)
        except ReportError as exc:
            if exc.status in (404, 405):  # a control plane that predates them: it never will
                log.warning("control plane does not take kept readings (%s): %d dropped", exc.summary,
                            self.backlog.clear())
            elif exc.status in (413, 422):  # it cannot take this batch: the same bytes fail again
                self.backlog.drop(count)
                log.warning("control plane refused %d kept reading(s) (%s): dropped", count, exc.summary)
            else:
                log.info("kept readings not sent yet (%s); trying again after the next report", exc.summary)
            return
        self.backlog.delivered(count)
        self.backlog.refused_total += len(answer.refused)
        # After an outage, on the record; a reading taken while one report was merely slow, only when asked.
        log.log(logging.INFO if self._outage else logging.DEBUG,
                "sent %d reading(s) kept while the control plane was away: %d stored, %d held already; %d still "
                "kept", count, answer.stored, answer.duplicates, len(self.backlog))
        if not len(self.backlog):
            self._outage = False
        if answer.refused:
            first = answer.refused[0]
            log.warning("control plane refused %d part(s) of the kept readings; the first, reading %d (%s)%s: %s",
                        len(answer.refused), first.sequence, first.sent_at.isoformat(),
                        f" for {first.subject}" if first.subject else "", first.reason)

    async def _until_next_report(self, stop: asyncio.Event, due: float) -> None:
        """Wait until ``due`` (a loop time), to the end of the collector's pass nearest it: the report then carries
        figures read a moment ago, in the same wakeup as the pass (agent.ticks), rather than figures of any age up
        to a scrape interval. A report due more often than the passes, or a pass that does not come (a GPU read
        that hangs), waits on the clock: at most half a scrape interval late."""
        scrape = self.config.scrape_interval
        interval = due - _loop_time()
        if scrape <= 0 or interval < scrape / 2:
            await _wait(stop, max(0.0, interval))
            return
        await _wait(stop, interval - scrape / 2)
        if stop.is_set():
            return
        self._pass_done.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pass_done.wait(), timeout=scrape)  # set at stop too

    # ---- lifecycle --------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set; then drain and stop every managed replica, and return."""
        saved = self.desired_store.load()
        if saved is not None:
            self.apply_desired(saved)
        app = create_app(self, engine_client=self.scrape_client)
        server = EmbeddedServer(server_config(app, self.config.host, self.config.port))
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(r.run(), name=f"replica-{n}") for n, r in self.replicas.items()]
            tg.create_task(self._collect_loop(stop), name="collector")
            tg.create_task(server.serve(), name="http")
            await server.listening.wait()
            # Reports start once load balancers can check readiness here: a restarted agent that adopts a READY
            # engine must not tell the control plane READY while the replica is still out of rotation.
            tg.create_task(self._report_loop(stop), name="reporter")
            self.bound_port = server.servers[0].sockets[0].getsockname()[1] if server.servers else None
            log.info("agent %s listening on %s:%s with %d replicas", self.node, self.config.host,
                     self.bound_port, len(self.replicas))
            if ready is not None:
                ready.set()
            await stop.wait()
            for replica in self.replicas.values():
                replica.request_shutdown()
            if tasks:
                await asyncio.wait(tasks)
            self.canaries.cancel()
            server.exit()
        if self.docker is not None:
            await self.docker.close()
        self.gpu.close()


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
