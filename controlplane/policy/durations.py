"""Durations in policy files: "90s", "5m", "1h", "1h30m" or a plain number of seconds."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: object) -> float:
    """Seconds in ``value``; raises ValueError with the accepted forms when it is not a duration."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 60s, 5m or 1h, got a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        pos, total = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if text and pos == len(text):
            return total
    raise ValueError(f"invalid duration {value!r}: use a number of seconds or a form such as 60s, 5m, 1h, 1h30m")


def format_duration(seconds: float) -> str:
    """The shortest readable form of ``seconds`` ("90s" -> "1m30s"), for reason texts."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"


# A policy field holding a duration, stored as seconds.
Duration = Annotated[float, BeforeValidator(parse_duration)]
