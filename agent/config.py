"""Agent configuration: a YAML file validated by pydantic, overridable by ``PITSTOP_AGENT_*`` variables.

Every setting has a default, so ``pitstop agent`` runs with no file at all (loopback, standalone if the
control plane is away, GPU-only). Errors name the file, the field and, where YAML can tell, the line.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.container_settings import FieldError, check_container_settings
from agent.live_cap import SCHEDULER_CLS, SCHEDULER_FLAG
from agent.tls import normalise_pin
from agent.wire import MAX_GPU_INDEX, NAME_PATTERN
from engines import EngineAdapter, adapter

ENV_PREFIX = "PITSTOP_AGENT_"

# The simulator (``pitstop sim serve``), speaking the replica's engine by the adapter's ``sim_flags``.
SIM_COMMAND = [sys.executable, "-m", "pitstop.cli", "sim", "serve", "{model}", "--host", "{host}", "--port", "{port}"]


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the file, line and field."""


class Clash(ValueError):
    """Two settings that cannot both hold: raised at ``loc`` (a field path), naming the setting it clashes with
    at ``other``, so the error can give both their lines."""

    def __init__(self, message: str, loc: tuple[int | str, ...], other: tuple[int | str, ...]) -> None:
        super().__init__(message)
        self.loc = loc
        self.other = other


class FieldProblem(ValueError):
    """A model check's finding that belongs to one of the model's fields: the error names that field's line."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def names_flag(args: list[str], flag: str) -> bool:
    """Whether engine arguments give ``flag``, as ``--flag VALUE`` or ``--flag=VALUE``."""
    return any(a == flag or a.startswith(f"{flag}=") for a in args)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WarmupConfig(_Strict):
    """Requests sent after the engine answers and before it is marked READY (first requests are slow):
    at least ``requests``, then until the last ``settle_count`` TTFTs agree within ``settle_tolerance``
    (relative) or ``settle_floor_seconds``, at most ``max_requests`` (``agent.warmup``)."""

    requests: int = Field(default=2, ge=0, le=1000)
    max_requests: int = Field(default=12, ge=0, le=1000)
    settle_count: int = Field(default=3, ge=0, le=100)  # 0 or 1: a fixed count of ``requests``
    settle_tolerance: float = Field(default=0.25, ge=0)
    settle_floor_seconds: float = Field(default=0.003, ge=0)
    prompt: str = "Hello"
    max_tokens: int = Field(default=8, ge=1, le=4096)
    timeout: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _bounded(self) -> WarmupConfig:
        if self.max_requests < self.requests:
            raise ValueError("max_requests must be at least requests")
        return self


class ReplicaConfig(_Strict):
    """One engine replica: managed (the agent starts it) or attached (only ``url``: monitored, never touched)."""

    name: str = Field(pattern=NAME_PATTERN)
    model: str = ""
    url: str | None = None
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535)
    # GPU indices as NVML numbers them (the wire's bound: a report naming another index would be refused).
    gpus: list[Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]] = Field(default_factory=lambda: [0], max_length=64)
    # The engine the replica runs (``engines/``): vllm or sglang; ``sim`` is the simulator speaking vLLM, as
    # ``engine: vllm`` with ``simulated: true``.
    engine: Literal["sim", "vllm", "sglang"] = "sim"
    # The simulator stands in for the engine (the demo, the tests): it speaks the engine's API and metrics.
    simulated: bool = False
    command: list[str] | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    start_timeout: float = Field(default=600.0, gt=0)
    drain_timeout: float = Field(default=60.0, ge=0)
    # After readiness goes off, how long the load balancer needs to notice before in-flight work is counted.
    # Set it above the balancer's check interval x fall count; the default suits HAProxy's inter 1s fall 3.
    drain_grace: float = Field(default=5.0, ge=0)
    stop_timeout: float = Field(default=30.0, ge=0)
    # Passed to the engine as ``--shutdown-timeout N`` unless ``args`` already name it: with 0 (vLLM's default)
    # SIGTERM aborts in-flight requests and can stall 15-120 s; with N > 0 vLLM finishes stragglers (docs/design.md).
    shutdown_timeout: float | None = Field(default=None, ge=0)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    # Health/model probes and scrapes: generous, a starved API server answers slowly (docs/design.md).
    probe_timeout: float = Field(default=5.0, gt=0)
    log_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    log_backups: int = Field(default=3, ge=0, le=100)
    enabled: bool = True
    # A live cap on running requests, changed with no restart (``agent.live_limits``): the engine runs Pitstop's
    # scheduler plug-in. Opt-in: the plug-in uses a vLLM interface vLLM does not promise to keep.
    live_limits: bool = False
    # What runs the engine (``agent.runtime``): a child process of the agent, or a Docker or Podman container
    # (``agent.containers``; its settings below, checked by ``agent.container_settings``).
    runtime: Literal["process", "container"] = "process"
    image: str | None = None
    pull: Literal["never", "missing", "always"] = "missing"  # air-gapped hosts: never
    volumes: list[str] = Field(default_factory=list)  # HOST:CONTAINER[:ro], as Docker writes them
    shm_size: int | str | None = None  # bytes, or 16g; vLLM's tensor-parallel workers share memory through it
    ipc: Literal["host", "private", "shareable"] | None = None
    network: Literal["host", "published"] = "host"  # published: the container's port on host:port

    @model_validator(mode="after")
    def _runtime_takes_its_settings(self) -> ReplicaConfig:
        try:
            check_container_settings(self.runtime, self.url, self.image, self.volumes, self.shm_size, self.ipc,
                                     self.live_limits, self.model_fields_set)
        except FieldError as exc:
            raise FieldProblem(str(exc), exc.field) from None
        return self

    @model_validator(mode="after")
    def _managed_or_attached(self) -> ReplicaConfig:
        if self.url is None and self.port is None:
            raise ValueError("a managed replica needs 'port' (or give 'url' to attach to a running engine)")
        if self.url is None and not self.model:
            raise ValueError("a managed replica needs 'model'")
        return self

    @model_validator(mode="after")
    def _engine_can_do_it(self) -> ReplicaConfig:
        engine = self.adapter
        if self.shutdown_timeout is not None and engine.shutdown.timeout_flag is None:
            raise FieldProblem(f"{engine.title} drains on SIGTERM with no timeout of its own: 'stop_timeout' is what "
                               "bounds a stop", "shutdown_timeout")
        if self.live_limits and not engine.live_cap:
            raise FieldProblem(f"live_limits is a vLLM scheduler plug-in; {engine.title} has none (a "
                               f"{engine.governed_flag} change restarts the engine)", "live_limits")
        return self

    @model_validator(mode="after")
    def _live_limits_need_an_engine_the_agent_starts(self) -> ReplicaConfig:
        # vLLM and the simulator both take the plug-in by --scheduler-cls.
        if not self.live_limits:
            return self
        if not self.managed:
            raise FieldProblem("live_limits needs a managed replica: the agent loads the plug-in when it starts "
                               "the engine, and an attached one it never starts", "live_limits")
        if names_flag(self.args, SCHEDULER_FLAG):
            raise FieldProblem("live_limits puts its own scheduler in place: 'args' must not name --scheduler-cls",
                               "args")
        return self

    @property
    def managed(self) -> bool:
        return self.url is None

    @property
    def adapter(self) -> EngineAdapter:
        """What Pitstop knows of the replica's engine (``engines/``)."""
        return adapter("vllm" if self.engine == "sim" else self.engine)

    @property
    def is_simulated(self) -> bool:
        return self.simulated or self.engine == "sim"

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/") if self.url else f"http://{self.host}:{self.port}"

    def argv(self, args: list[str] | None = None) -> list[str]:
        """The engine's argv: the command template filled in, then the engine flags (``args`` overrides).

        A container with a published port listens on every address of its own network; the port is published on
        ``host`` only."""
        engine = self.adapter
        template = self.command if self.command is not None else (
            [*SIM_COMMAND, *engine.sim_flags] if self.is_simulated else list(engine.command))
        listen = "0.0.0.0" if self.runtime == "container" and self.network == "published" else self.host
        values = {"model": self.model, "host": listen, "port": str(self.port)}
        flags = list(self.args if args is None else args)
        stop_flag = engine.shutdown.timeout_flag
        if self.shutdown_timeout is not None and stop_flag is not None and not names_flag(flags, stop_flag):
            flags += [stop_flag, f"{self.shutdown_timeout:g}"]
        if self.live_limits and not names_flag(flags, SCHEDULER_FLAG):  # the desired state's args may name one
            flags += [SCHEDULER_FLAG, SCHEDULER_CLS]
        return [part.format(**values) for part in template] + flags


class BackoffConfig(_Strict):
    """Crash-loop policy: 10·2ⁿ s capped at 300 s; FATAL after ``max_failures`` within ``window``."""

    base: float = Field(default=10.0, gt=0)
    cap: float = Field(default=300.0, gt=0)
    max_failures: int = Field(default=5, ge=1)
    window: float = Field(default=600.0, gt=0)


class AgentConfig(_Strict):
    node: str = Field(default_factory=lambda: _default_node(), pattern=NAME_PATTERN)
    host: str = "127.0.0.1"
    port: int = Field(default=9400, ge=0, le=65535)
    control_plane: str | None = "http://127.0.0.1:8000"
    token: str | None = None
    # https control planes: a private CA bundle (PEM) instead of the system CAs, and optionally the SHA-256
    # fingerprint of the control plane's certificate, checked during the handshake (``agent/tls.py``).
    control_plane_ca_file: Path | None = None
    control_plane_pin_sha256: str | None = None
    report_interval: float = Field(default=5.0, gt=0)
    # While reports fail, a reading is still taken every report interval and kept, up to this long (the oldest
    # dropped first, counted): sent once the control plane answers again, so a partition leaves no hole in the
    # node's history (``agent.backlog``). 0: nothing kept.
    report_backlog_seconds: float = Field(default=900.0, ge=0, le=86400)
    scrape_interval: float = Field(default=5.0, gt=0)
    # Process trees (RSS, CPU, threads, fds) at most this often: leaks grow over minutes (the leak policies want
    # 9 minutes of samples), and each sample reads several /proc files per process (four per vLLM engine), so
    # 15 s, Prometheus's own interval: a new engine is sampled at once.
    process_interval: float = Field(default=15.0, gt=0)
    gpu_backend: Literal["auto", "nvml", "sim", "recorded"] = "auto"
    sim_gpu_dir: Path = Path("./.pitstop/simgpu")
    sim_gpu_count: int = Field(default=1, ge=0, le=64)
    recorded_gpu_file: Path | None = None
    state_dir: Path | None = None
    # A streaming canary to each serving replica about every this many seconds: with every Nth scrape, N the
    # nearest whole number of scrape intervals, at least 1 (0: off). On by default: a wedged engine answers
    # /health 200, and a canary that cannot finish while no token moves is how the agent sees it
    # (``agent.progress``). Its own setting, not the scrape's: a canary is a request the engine serves, and
    # readiness goes off within this plus two ``canary_timeout`` of a wedge.
    canary_interval: float = Field(default=5.0, ge=0)
    # The older form, in scrape intervals: when given, it is N (and ``canary_interval`` N scrape intervals).
    canary_every: int | None = Field(default=None, ge=0)
    # The canary's deadline, end to end. Short on purpose: a late canary while tokens move is a busy engine and
    # is never acted on, so the deadline only has to be longer than an idle engine's 4-token answer.
    canary_timeout: float = Field(default=3.0, gt=0)
    # Canaries failed in a row, with no generation token moving, before the replica is WEDGED (readiness off).
    wedge_canaries: int = Field(default=2, ge=1, le=20)
    backoff: BackoffConfig = Field(default_factory=BackoffConfig)
    # Processes on this node's GPUs that no replica started (gpustack#2595): looked for at start and then
    # every this many seconds; reported always, ended (SIGTERM, then SIGKILL at the next check) only if asked.
    orphan_check_interval: float = Field(default=30.0, gt=0)
    kill_orphans: bool = False
    # Stack dumps before a restart the control plane asks to capture (``agent/stackdump.py``): py-spy from this
    # path, else from PATH or beside the agent's Python; never waited for longer than the timeout.
    py_spy: Path | None = None
    stack_dump_timeout: float = Field(default=10.0, gt=0, le=120)
    # The container runtime (replicas with ``runtime: container``): the daemon's Docker Engine API, which Podman
    # serves too (``podman system service``), and how a replica's ``gpus`` reach its container: the nvidia
    # driver's device requests, CDI device names (nvidia.com/gpu=N), or none (no GPU: a simulator, a CPU build).
    docker_host: str = Field(default="unix:///var/run/docker.sock", pattern=r"^(unix:///|tcp://)\S+$")
    container_gpus: Literal["nvidia", "cdi", "none"] = "nvidia"
    replicas: list[ReplicaConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _pin_is_a_fingerprint(self) -> AgentConfig:
        if self.control_plane_pin_sha256 is not None:
            normalise_pin(self.control_plane_pin_sha256)  # raises ValueError with the field's rule
        return self

    @model_validator(mode="after")
    def _canary_in_seconds(self) -> AgentConfig:
        if self.canary_every is not None:
            self.canary_interval = self.canary_every * self.scrape_interval
        return self

    def engine_env(self, spec: ReplicaConfig, environ: Mapping[str, str]) -> dict[str, str]:
        """What the agent adds to a managed engine's environment (the replica's own ``env`` still wins).

        The engine's keep-alive variable (vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``): its API server closes a
        connection idle that many seconds (5 when unset), and the agent reads each engine every
        ``scrape_interval`` (5 s): at the defaults every scrape opened a new connection, and the close of the old
        one woke the agent too. Past two scrape intervals the agent keeps one connection per engine. Left alone
        when the agent's own environment or the replica's sets it."""
        env = {"PITSTOP_SIM_GPU_DIR": str(self.sim_gpu_dir)} if spec.is_simulated else {}
        keep_alive = spec.adapter.keep_alive_var
        if keep_alive is not None and keep_alive not in environ and keep_alive not in spec.env:
            env[keep_alive] = str(max(5, math.ceil(2 * self.scrape_interval) + 5))
        return env

    @property
    def canary_scrapes(self) -> int:
        """A canary with every this many scrapes of a replica (0: none); counted, so no clock decides it."""
        if self.canary_every is not None:
            return self.canary_every
        if self.canary_interval <= 0:
            return 0
        return max(1, round(self.canary_interval / self.scrape_interval))

    @model_validator(mode="after")
    def _no_clashes(self) -> AgentConfig:
        clash = replica_clash(self)
        if clash is not None:
            raise clash
        return self

    @property
    def resolved_state_dir(self) -> Path:
        return self.state_dir if self.state_dir is not None else Path(f"./.pitstop/agent-{self.node}")


# Hosts that listen on every interface: a port there is taken on all the others too.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def _same_address(host_a: str, host_b: str) -> bool:
    """Whether two listen hosts can be the same socket address (a wildcard overlaps every host)."""
    a, b = ("127.0.0.1" if h == "localhost" else h for h in (host_a.strip().lower(), host_b.strip().lower()))
    return a == b or a in _WILDCARDS or b in _WILDCARDS


def replica_clash(config: AgentConfig) -> Clash | None:
    """The first replica that cannot run beside the others: a name already used, a managed replica's host:port
    already another's (the second engine could not bind, and its probes would reach the first), or the agent's
    own port."""
    seen: dict[str, int] = {}
    for i, replica in enumerate(config.replicas):
        if replica.name in seen:
            first = seen[replica.name]
            return Clash(f"replica names must be unique: replicas {first} and {i} are both named {replica.name!r}",
                         ("replicas", i, "name"), ("replicas", first, "name"))
        seen[replica.name] = i
    managed = [(i, r) for i, r in enumerate(config.replicas) if r.managed]
    for n, (i, replica) in enumerate(managed):
        where = f"{replica.host}:{replica.port}"
        if config.port and replica.port == config.port and _same_address(replica.host, config.host):
            agent = "" if replica.host == config.host else f" ({config.host}:{config.port})"
            return Clash(f"replica {replica.name!r} would listen on {where}, the agent's own port{agent}: the "
                         f"engine could not bind it", ("replicas", i, "port"), ("port",))
        for j, other in managed[:n]:
            if other.port == replica.port and _same_address(replica.host, other.host):
                both = (f"both listen on {where}" if replica.host == other.host else
                        f"listen on one port ({other.host}:{other.port} and {where})")
                return Clash(f"replicas {other.name!r} and {replica.name!r} would {both}: the second engine "
                             f"could not bind it, and its probes would reach the first",
                             ("replicas", i, "port"), ("replicas", j, "port"))
    return None


def _default_node() -> str:
    # Hostnames may carry dots and odd characters; keep the first label and make it a valid name.
    label = socket.gethostname().split(".")[0]
    cleaned = "".join(c if c.isalnum() or c in "-_" else "-" for c in label).strip("-_")
    return cleaned[:63] or "node"


# Environment overrides: only the scalar main settings; replicas belong in the file.
_ENV_FIELDS = ("node", "host", "port", "control_plane", "token", "report_interval", "scrape_interval",
               "gpu_backend", "sim_gpu_dir", "sim_gpu_count", "recorded_gpu_file", "state_dir",
               "control_plane_ca_file", "control_plane_pin_sha256", "docker_host", "container_gpus")


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in _ENV_FIELDS:
        key = ENV_PREFIX + field.upper()
        if key in env:
            value: Any = env[key]
            if field == "control_plane" and value.strip().lower() in ("", "null", "none"):
                value = None
            out[field] = value
    return out


def _line_of(text: str, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line where the YAML node at ``loc`` starts, when the document can be composed."""
    try:
        node: Any = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            if match is None:
                break
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _format_errors(source: str, text: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc, message = tuple(err["loc"]), err["msg"]
        clash = err.get("ctx", {}).get("error")
        if isinstance(clash, Clash):  # found by a model check: its own field, and where the other one is
            other = _line_of(text, clash.other) if text else None
            loc = clash.loc
            there = f"{source}:{other}" if other else "its default or the environment"
            message = f"{clash} ({_field(clash.other)}: {there})"
        elif isinstance(clash, FieldProblem):  # "volumes.1": the field's second item
            loc, message = (*loc, *(int(p) if p.isdigit() else p for p in clash.field.split("."))), str(clash)
        line = _line_of(text, loc) if text else None
        where = f"{source}:{line}" if line else source
        lines.append(f"{where}: {_field(loc)}: {message}")
    return "\n".join(lines)


def parse_config(text: str, source: str = "<config>", env: Mapping[str, str] | None = None) -> AgentConfig:
    """Validate YAML text (plus environment overrides) into an ``AgentConfig``; raise ``ConfigError``."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings")
    data.update(_env_overrides(os.environ if env is None else env))
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, text, exc)) from exc


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Load the config file at ``path`` (``None``: defaults only)."""
    if path is None:
        return parse_config("", "<defaults>", env)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_config(text, str(path), env)
