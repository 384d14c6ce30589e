"""The container runtime: each replica's engine in a Docker or Podman container, through the Docker Engine API
(``agent.docker_api``; docs/design.md, "Runtimes").

A container Pitstop starts carries labels (node, replica, generation, the engine's arguments and a mark of this
start) and a name made from them, ``pitstop-<node>-<replica>-<generation>``. It runs with no restart policy:
Pitstop restarts engines, not the daemon. It outlives its agent, as an engine process does: the next agent finds
it by its labels, adopts the running one and removes the stale ones (``take_over``, ``end_leftovers``). A
container of that name that does not carry the labels is someone else's: never removed, the start refused.

The engine's exit is watched through its host pid, not through the daemon, so a daemon that restarts or stops
answering under a running replica disturbs nothing; the exit code, and whether the kernel's OOM killer ended it,
are read from the daemon once the pid is gone. The host pid is also what the readings (RSS, GPU memory through
NVML), the stack dump (through the host's ``/proc``) and the connection count read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import signal
from collections.abc import Mapping
from typing import Any, Literal

import psutil

from agent.config import ReplicaConfig
from agent.container_settings import size_bytes
from agent.docker_api import DaemonError, DaemonUnreachable, DockerApi
from agent.engine_proc import pid_exit, process_gone
from agent.pidfile import ENGINE_MARK
from agent.runtime import Ended, Engine, Found, StartRefused

log = logging.getLogger(__name__)

LABEL = "io.pitstop."
NODE, REPLICA, GENERATION, ARGS, MARK = (LABEL + k for k in ("node", "replica", "generation", "args", "mark"))
POLL_SECONDS = 0.2  # how often a running container's host pid is looked at, where no pidfd can watch it
EXIT_READ_SECONDS = 5.0  # how long an exit waits for the daemon to say its code
LOG_LINES = 200

GpuMode = Literal["nvidia", "cdi", "none"]


def container_name(node: str, replica: str, generation: int) -> str:
    return f"pitstop-{node}-{replica}-{generation}"


def describe_exit(state: Mapping[str, Any] | None) -> str:
    """How a container ended, from its ``State``: "container exited with code 137, OOMKilled"."""
    if not state:
        return "container exited; its exit code is unknown (the daemon did not say)"
    text = f"container exited with code {state.get('ExitCode')}"
    if state.get("OOMKilled"):
        text += ", OOMKilled"
    if state.get("Error"):
        text += f": {state['Error']}"
    return text


def container_body(spec: ReplicaConfig, argv: list[str], env: Mapping[str, str], labels: Mapping[str, str],
                   gpus: GpuMode) -> dict[str, Any]:
    """The create call's body for ``spec``'s engine: its command, environment, labels, mounts and devices."""
    host: dict[str, Any] = {"Binds": list(spec.volumes), "RestartPolicy": {"Name": "no"}}
    body: dict[str, Any] = {"Image": spec.image, "Entrypoint": argv[:1], "Cmd": argv[1:],
                            "Env": [f"{k}={v}" for k, v in env.items()], "Labels": dict(labels),
                            "HostConfig": host}
    if spec.network == "host":
        host["NetworkMode"] = "host"
    else:
        port = f"{spec.port}/tcp"
        body["ExposedPorts"] = {port: {}}
        host["PortBindings"] = {port: [{"HostIp": spec.host, "HostPort": str(spec.port)}]}
    if spec.shm_size is not None:
        host["ShmSize"] = size_bytes(spec.shm_size)
    if spec.ipc is not None:
        host["IpcMode"] = spec.ipc
    if gpus == "nvidia":  # what `docker run --gpus device=0,1` sends
        host["DeviceRequests"] = [{"Driver": "nvidia", "DeviceIDs": [str(g) for g in spec.gpus],
                                   "Capabilities": [["gpu"]]}]
    elif gpus == "cdi":  # what `podman run --device nvidia.com/gpu=0` sends
        host["Devices"] = [{"PathOnHost": f"nvidia.com/gpu={g}", "PathInContainer": "", "CgroupPermissions": ""}
                           for g in spec.gpus]
    return body


def _host_pid(record: Mapping[str, Any] | None) -> int:
    """The host's pid of a container's first process, from its inspected record (0: not running)."""
    return int(((record or {}).get("State") or {}).get("Pid") or 0)


def _name(listed: Mapping[str, Any]) -> str:
    """A listed container's name, without the leading slash the list gives it."""
    return str((listed.get("Names") or ["?"])[0]).lstrip("/")


def _pid_created(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _signal_tree(pid: int, sig: signal.Signals) -> None:
    """``sig`` to the container's first process and every process under it, as seen from the host."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error, OSError):
                proc.send_signal(sig)


class ContainerEngine:
    """One running container: the same calls as ``agent.engine_proc.EngineProcess``."""

    def __init__(self, api: DockerApi, ident: str, name: str, pid: int, *, poll: float = POLL_SECONDS) -> None:
        self.api = api
        self.ident = ident
        self.name = name
        self.pid = pid
        self.created = _pid_created(pid) if pid else None
        self.returncode: int | None = None
        self.ended = ""
        self._last_words: list[str] = []
        self._poll = poll
        self._exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watch = asyncio.create_task(self._watch_exit(), name=f"container-{name}")

    @property
    def gone(self) -> bool:
        return self.returncode is not None or not self.pid or process_gone(self.pid, self.created)

    @property
    def how_it_ended(self) -> str:
        return "still running" if self.returncode is None else self.ended

    async def _watch_exit(self) -> None:
        await pid_exit(self.pid, self.created, self._poll)
        state = await self._exit_state()
        self.ended = describe_exit(state)
        code = state.get("ExitCode") if state else None
        self.returncode = code if isinstance(code, int) else -1
        with contextlib.suppress(DaemonUnreachable, DaemonError, TimeoutError):
            self._last_words = await asyncio.wait_for(self.api.log_lines(self.ident, LOG_LINES), EXIT_READ_SECONDS)
        self._exited.set_result(None)

    async def _exit_state(self) -> dict[str, Any] | None:
        """The container's ``State`` once the daemon has seen the exit; None if it cannot say in time (a daemon
        that is down or hung: the exit is the engine's, and is reported at once all the same)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EXIT_READ_SECONDS
        while True:
            try:
                record = await asyncio.wait_for(self.api.inspect(self.ident), max(0.1, deadline - loop.time()))
            except (DaemonUnreachable, DaemonError, TimeoutError):
                record = None
            state = record.get("State") if record else None
            if state and not state.get("Running"):
                return dict(state)
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(0.1)

    async def exited(self) -> int:
        await asyncio.shield(self._exited)
        return self.returncode if self.returncode is not None else -1

    async def wait(self) -> int:
        return await self.exited()

    async def last_words(self) -> list[str]:
        if self.returncode is None:
            with contextlib.suppress(DaemonUnreachable, DaemonError):
                return await self.api.log_lines(self.ident, LOG_LINES)
        return list(self._last_words)

    async def stop(self, grace: float) -> int:
        """The daemon's stop (SIGTERM, SIGKILL after ``grace``), then removal. SIGCONT goes first to every process
        of the container: a frozen engine would sit out the whole grace with SIGTERM pending. Where the daemon does
        not answer, the engine is ended from the host: its first process is the container's init, and the kernel
        ends the rest of the container with it."""
        if self.returncode is None and self.pid:
            _signal_tree(self.pid, signal.SIGCONT)
        try:
            await self.api.stop(self.ident, grace)
        except (DaemonUnreachable, DaemonError) as exc:
            log.warning("container %s: stop through the daemon failed (%s); ending it from the host", self.name, exc)
            await self._end_from_host(grace)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.exited(), EXIT_READ_SECONDS + 5.0)
        await self._remove()
        return self.returncode if self.returncode is not None else -1

    async def _end_from_host(self, grace: float) -> None:
        if not self.pid:
            return
        _signal_tree(self.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exited), grace)
        if not process_gone(self.pid, self.created):
            _signal_tree(self.pid, signal.SIGKILL)

    async def kill(self) -> None:
        """SIGKILL the container and remove it, once its exit is read."""
        if self.returncode is None:
            try:
                await asyncio.wait_for(self.api.kill(self.ident), EXIT_READ_SECONDS)
            except (DaemonUnreachable, DaemonError, TimeoutError):
                if self.pid and not process_gone(self.pid, self.created):
                    _signal_tree(self.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited(), EXIT_READ_SECONDS + 5.0)
        await self._remove()

    async def _remove(self) -> None:
        if not self._watch.done():
            self._watch.cancel()
        try:  # bounded: a hung daemon must not hold back the replica's next step
            await asyncio.wait_for(self.api.remove(self.ident), EXIT_READ_SECONDS)
        except (DaemonUnreachable, DaemonError, TimeoutError) as exc:  # the next start removes it
            log.warning("container %s: not removed: %s", self.name, exc or "the daemon did not answer in time")


class ContainerRuntime:
    """Engines of one replica as containers of one daemon (``agent.runtime.Runtime``)."""

    def __init__(self, api: DockerApi, node: str, spec: ReplicaConfig, gpus: GpuMode, *,
                 poll: float = POLL_SECONDS) -> None:
        self.api = api
        self.node = node
        self.spec = spec
        self.gpus = gpus
        self.poll = poll
        self.labels = {NODE: node, REPLICA: spec.name}
        self._adopted: str | None = None  # the container ``take_over`` handed out: not a leftover

    def environment(self, own: Mapping[str, str]) -> dict[str, str]:
        """Only what the replica's engine is given: never the agent's own environment. With GPUs passed as
        devices the container sees only its own, numbered from 0, so the host's numbers are not passed on."""
        env = dict(own)
        if self.gpus != "none" and "CUDA_VISIBLE_DEVICES" not in self.spec.env:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        return env

    async def start(self, argv: list[str], env: Mapping[str, str], generation: int,
                    args: list[str]) -> Engine:
        image = self.spec.image or ""
        name = container_name(self.node, self.spec.name, generation)
        mark = secrets.token_hex(16)
        labels = {**self.labels, GENERATION: str(generation), ARGS: json.dumps(args), MARK: mark}
        body = container_body(self.spec, argv, {**env, ENGINE_MARK: mark}, labels, self.gpus)
        ident = ""
        try:
            await self._image_ready(image)
            await self._remove_stale()
            ident = await self._create(name, body)
            await self.api.start(ident)
            record = await self.api.inspect(ident)
        except DaemonUnreachable as exc:
            raise StartRefused(str(exc)) from None
        except DaemonError as exc:
            raise StartRefused(f"container {name}: the daemon refused it: {exc.message}") from None
        except asyncio.CancelledError:  # a wish that no longer wants this engine: its container goes too
            if ident:
                with contextlib.suppress(DaemonUnreachable, DaemonError):
                    await self.api.remove(ident)
            raise
        pid = _host_pid(record)
        log.info("replica %s: started container %s (%s), host pid %d", self.spec.name, name, ident[:12], pid)
        return ContainerEngine(self.api, ident, name, pid, poll=self.poll)

    async def _image_ready(self, image: str) -> None:
        pull = self.spec.pull
        if pull == "always" or (pull == "missing" and not await self.api.image_present(image)):
            try:
                await self.api.pull(image)
            except DaemonError as exc:
                raise StartRefused(f"pull of image {image} failed: {exc.message}") from None
        elif pull == "never" and not await self.api.image_present(image):
            raise StartRefused(f"image {image} is not on this host and 'pull' is never: load it (docker load, "
                               "podman load) or allow a pull")

    async def _create(self, name: str, body: Mapping[str, Any]) -> str:
        try:
            return await self.api.create(name, body)
        except DaemonError as exc:  # Docker says 409; Podman 500, "... is already in use"
            if exc.status != 409 and "already in use" not in exc.message:
                raise
        # The name is taken. Ours (labels of this node and replica): a stale one, removed. Anyone else's: kept.
        holder = await self.api.inspect(name)
        held_labels = ((holder or {}).get("Config") or {}).get("Labels") or {}
        if holder is not None and all(held_labels.get(k) == v for k, v in self.labels.items()):
            await self.api.remove(str(holder["Id"]))
            return await self.api.create(name, body)
        ident = str((holder or {}).get("Id", "?"))[:12]
        raise StartRefused(f"container name {name} is taken by container {ident}, which Pitstop did not start: "
                           "it is left alone; remove or rename it")

    async def _ours(self) -> list[dict[str, Any]]:
        return await self.api.listed(self.labels)

    async def _remove_stale(self) -> None:
        """Before a start: every container of this replica is from an engine that has ended or been replaced."""
        for listed in await self._ours():
            if listed["Id"] != self._adopted:
                await self.api.remove(str(listed["Id"]))

    async def take_over(self) -> Found | None:
        """The running container of this replica with the highest generation, adopted."""
        try:
            return await self._take_over()
        except (DaemonUnreachable, DaemonError) as exc:
            raise StartRefused(str(exc)) from None

    async def _take_over(self) -> Found | None:
        listed = await self._ours()
        running = []
        for item in listed:
            labels = item.get("Labels") or {}
            try:
                generation, args = int(labels[GENERATION]), json.loads(labels[ARGS])
            except (KeyError, ValueError):
                continue
            if item.get("State") == "running" and isinstance(args, list):
                running.append((generation, item, [str(a) for a in args]))
        if not running:
            return None
        generation, item, args = max(running, key=lambda r: r[0])
        pid = _host_pid(await self.api.inspect(str(item["Id"])))
        if not pid:
            return None
        name = _name(item)
        self._adopted = str(item["Id"])
        engine = ContainerEngine(self.api, self._adopted, name, pid, poll=self.poll)
        return Found(engine, generation, args, f"container {name}")

    async def end_leftovers(self, grace: float) -> list[Ended]:
        """Every other container of this replica: a running one stopped (its last lines kept), all removed."""
        try:
            return await self._end_leftovers(grace)
        except (DaemonUnreachable, DaemonError) as exc:
            raise StartRefused(str(exc)) from None

    async def _end_leftovers(self, grace: float) -> list[Ended]:
        listed = await self._ours()
        ended = []
        for item in listed:
            if item["Id"] == self._adopted:
                continue
            name = _name(item)
            if item.get("State") == "running":
                await self.api.stop(str(item["Id"]), grace)
                ended.append(Ended(f"container {name}", await self.api.log_lines(str(item["Id"]), LOG_LINES)))
            await self.api.remove(str(item["Id"]))
        return ended

    def forget(self) -> None:
        self._adopted = None

