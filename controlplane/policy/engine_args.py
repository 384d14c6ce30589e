"""Reading and rewriting vLLM engine flags in an argument list (``--max-num-seqs 128`` or ``--max-num-seqs=128``)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

# The governor's own lever; vLLM reads it (like every scheduler flag) only at start.
MAX_NUM_SEQS = "--max-num-seqs"


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
    """A digest of the engine arguments other than ``--max-num-seqs``: equal keys, same tuning but the batch.

    Samples carry it so the governor compares a max-num-seqs value only with readings taken under the same
    other flags (a value that broke the SLO before a flag rung says little about it after).
    """
    return zlib.crc32("\0".join(without_flag(args, MAX_NUM_SEQS)).encode())


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
    tensor = get_int_flag(args, "--tensor-parallel-size") or get_int_flag(args, "-tp") or 1
    pipeline = get_int_flag(args, "--pipeline-parallel-size") or get_int_flag(args, "-pp") or 1
    return len(gpus) > 1 or tensor * pipeline > 1
