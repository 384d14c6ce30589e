"""Reading and rewriting engine flags in an argument list (``--max-num-seqs 128`` or ``--max-num-seqs=128``).

Which flag is the governor's lever, and which tell an engine to span GPUs, is each engine's adapter's
(``engines/``): an engine's arguments carry its own flags and no other engine's, so reading "the governed
limit" needs no engine name, and writing it takes the engine's flag.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from engines import ADAPTERS, DEFAULT_ADAPTER, governed_flags

# The default engine's lever (vLLM's ``--max-num-seqs``); the engine reads it, like every scheduler flag, only at
# start. Each engine's own is ``adapter(name).governed_flag``.
MAX_NUM_SEQS = DEFAULT_ADAPTER.governed_flag
GOVERNED_FLAGS = tuple(sorted(governed_flags()))
_TENSOR = tuple(f for a in ADAPTERS.values() for f in a.rungs.tensor_parallel)
_PIPELINE = tuple(f for a in ADAPTERS.values() for f in a.rungs.pipeline_parallel)


def get_flag(args: Sequence[str], flag: str) -> str | None:
    """The value of the last occurrence of ``flag`` (argparse keeps the last one), or None when absent."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def get_int_flag(args: Sequence[str], flag: str) -> int | None:
    """``get_flag`` as an int; None when absent or not an integer."""
    raw = get_flag(args, flag)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def governed_limit(args: Sequence[str]) -> int | None:
    """The engine's cap on requests running at once, from its arguments: its governed flag (vLLM's
    ``--max-num-seqs``, SGLang's ``--max-running-requests``); None when absent (the engine's own default)."""
    for flag in GOVERNED_FLAGS:
        value = get_int_flag(args, flag)
        if value is not None:
            return value
    return None


def set_flag(args: Sequence[str], flag: str, value: str) -> list[str]:
    """A copy of ``args`` with every occurrence of ``flag`` removed and ``flag value`` appended once."""
    return [*without_flag(args, flag), flag, value]


def without_flag(args: Sequence[str], flag: str) -> list[str]:
    """A copy of ``args`` with every occurrence of the valued ``flag`` (and its value) removed."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = i + 1 < len(args)
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out


def flags_key(args: Sequence[str]) -> int:
    """A digest of the engine arguments other than the governed flag: equal keys, same tuning but the batch.

    Samples carry it so the governor compares a max-num-seqs value only with readings taken under the same
    other flags (a value that broke the SLO before a flag rung says little about it after).
    """
    for flag in GOVERNED_FLAGS:
        args = without_flag(args, flag)
    return zlib.crc32("\0".join(args).encode())


def has_flag(args: Sequence[str], flag: str, value: str | None) -> bool:
    """Whether ``args`` already carry ``flag`` (a switch when ``value`` is None) with that value."""
    if value is None:
        return flag in args
    return get_flag(args, flag) == value


def with_flag(args: Sequence[str], flag: str, value: str | None) -> list[str]:
    """``args`` with ``flag`` added: a switch once, a valued flag replacing any earlier value."""
    if value is None:
        return list(args) if flag in args else [*args, flag]
    return set_flag(args, flag, value)


def spans_gpus(args: Sequence[str], gpus: Sequence[int]) -> bool:
    """Whether an engine runs over more than one GPU: several GPUs assigned, or tensor/pipeline parallel > 1."""
    tensor = next((v for f in _TENSOR if (v := get_int_flag(args, f))), 1)
    pipeline = next((v for f in _PIPELINE if (v := get_int_flag(args, f))), 1)
    return len(gpus) > 1 or tensor * pipeline > 1
