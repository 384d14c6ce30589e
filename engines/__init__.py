"""What Pitstop knows about each serving engine, in one place per engine: an adapter.

The agent, the governor, the alert rules and the dashboards read an adapter instead of naming an engine
(docs/design.md, "Engines"). An adapter is plain data: it imports nothing else of Pitstop's and does no IO, so
the agent and the control plane's pure policy layer both read it.

- ``vllm`` (``engines/vllm.py``): vLLM 0.33, older metric names read where vLLM renamed them.
- ``sglang`` (``engines/sglang.py``): SGLang with ``--enable-metrics``.
"""

from __future__ import annotations

from engines.sglang import SGLANG
from engines.types import EngineAdapter, EngineMetric, EngineName, Kind, Probes, Rungs, Shutdown
from engines.vllm import VLLM

ADAPTERS: dict[str, EngineAdapter] = {a.name: a for a in (VLLM, SGLANG)}
DEFAULT_ENGINE: EngineName = "vllm"
DEFAULT_ADAPTER = VLLM  # replicas that name no engine run vLLM, as before engines had names


def adapter(name: str | None) -> EngineAdapter:
    """The adapter of engine ``name`` (vLLM when None: replicas reported before engines had names)."""
    found = ADAPTERS.get(name or DEFAULT_ENGINE)
    if found is None:
        raise KeyError(f"unknown engine {name!r}: one of {', '.join(ADAPTERS)}")
    return found


def governed_flags() -> frozenset[str]:
    """Every engine's governed concurrency flag: an engine's arguments carry its own and no other's."""
    return frozenset(a.governed_flag for a in ADAPTERS.values())


__all__ = ["ADAPTERS", "DEFAULT_ADAPTER", "DEFAULT_ENGINE", "SGLANG", "VLLM", "EngineAdapter",
           "EngineMetric", "EngineName", "Kind", "Probes", "Rungs", "Shutdown", "adapter", "governed_flags"]
