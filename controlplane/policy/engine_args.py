"""Reading and rewriting vLLM engine flags in an argument list (``--max-num-seqs 128`` or ``--max-num-seqs=128``)."""

from __future__ import annotations

from collections.abc import Sequence


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
    return [*out, flag, value]
