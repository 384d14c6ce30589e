"""``pack`` and ``unpack``: one node's samples at one instant as one compact value (docs/design.md, "The store").

A report carries a sample of every replica and every GPU on its node, all at the report's time. Stored one row
per subject, as JSON text, each reading cost about 1 KB on disk: the field names, the digits of every number
as text, and a row and an index entry per subject. Packed, a node's report is one row (format 2):

- a small JSON head naming each subject and its fields, the whole-numbered ones and the others apart, with the
  values that are not numbers (a GPU's XID codes and throttle reasons, a replica's scrape window) beside them;
- every whole number (a count, a counter, a byte size, a setting) as an integer of the fewest bytes that hold it,
  its width named by one letter in a line after the head: most take one to four bytes instead of eight;
- every other number as an 8-byte float (exact: counters are compared for equality, and rounding a latency
  could move it across a condition's threshold), their bytes stored by significance: every float's first byte,
  then every second byte, and so on. Readings of one kind share their sign, exponent and leading digits, so the
  first planes compress to almost nothing, where the floats side by side did not;
- all of it compressed together, with a preset dictionary (``_DICTIONARY_2``): a GPU's and a replica's head as
  this format writes them, with every field name known when the format was set. The names then cost a few bytes
  a subject, and settings that repeat across a node's replicas (the generation, the running limit) little more.
  A name the dictionary lacks is stored all the same, at the cost of its letters.

Every value comes back exactly as it went in, whole numbers as floats. A leading format byte lets one layout be
told from another: format 1 (every number an 8-byte float in the head's order) is still read, and ``unpack``
refuses a format it does not know rather than misreading it.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

FORMAT = 2  # what ``pack`` writes
FORMAT_1 = 1
_HEAD_END = b"\0"  # JSON text never holds a NUL byte
# zlib's best ratio: compressing a node of 8 replicas and 8 GPUs takes about 0.12 ms, 30 microseconds more than
# at the default level, for about 1 % fewer bytes: enough for six rows instead of five in a PostgreSQL page.
_LEVEL = 9

# Part of format 1: rows written with it are read with it, so it never changes; a new format gets its own.
_NAMES = (
    b'[["replica","r0",["requests_running","requests_waiting","kv_cache_usage_ratio","generation_tokens_total",'
    b'"generation_tokens_per_second","requests_per_second","errors_per_second","requests_lost","preemptions_total",'
    b'"preemptions_per_second","ttft_p50_seconds","ttft_p95_seconds","ttft_p99_seconds","itl_p50_seconds",'
    b'"itl_p95_seconds","itl_p99_seconds","e2e_p99_seconds","rss_bytes","gpu_memory_bytes","cpu_percent",'
    b'"canary_ok","canary_ttft_seconds","generation","max_num_seqs","live_cap","flags_key","window"],'
    # A scrape window (``EngineWindow``) with vLLM's default TTFT and inter-token latency buckets.
    b'{"window":{"ended_at":"2026-01-01T00:00:00.000000Z","seconds":5.0,"steps":0.0,"ttft":{"bounds":'
    b'[0.001,0.005,0.01,0.02,0.04,0.06,0.08,0.1,0.25,0.5,0.75,1.0,2.5,5.0,7.5,10.0,20.0,40.0,80.0,160.0,640.0,'
    b'2560.0],"counts":[0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,'
    b'0.0]},"itl":{"bounds":[0.01,0.025,0.05,0.075,0.1,0.15,0.2,0.3,0.4,0.5,0.75,1.0,2.5,5.0,7.5,10.0,20.0,40.0,'
    b'80.0],"counts":[0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0]}}}],'
    b'["gpu","0",["temperature_celsius","memory_used_bytes","utilization_ratio","power_watts","xid_events_total",'
    b'"ecc_uncorrected_total"],{"xids":[],"throttle_reasons":["sw_power_cap","thermal","hw_slowdown"]}]]'
)

# Part of format 2, as ``_NAMES`` is of format 1: the head of a GPU and of a replica as format 2 writes them,
# every signal in the order the ingest writes it (``policy.signals.DECLARED``), the whole-numbered ones where
# they usually are, and a scrape window in vLLM's default buckets. Preset in this shape, a row's first GPU and
# replica cost about as little as the ones after them (34 bytes less a node row than with ``_NAMES``).
_DICTIONARY_2 = (
    b'[["gpu","0",["temperature_celsius","memory_used_bytes","power_watts","xid_events_total",'
    b'"ecc_uncorrected_total"],["utilization_ratio"],{"xids":[],"throttle_reasons":["sw_power_cap","thermal",'
    b'"hw_slowdown"]}],["replica","r0",["requests_running","requests_waiting","preemptions_total",'
    b'"generation_tokens_total","errors_per_second","rss_bytes","gpu_memory_bytes","canary_ok","generation",'
    b'"requests_lost","live_cap","preemptions_per_second","max_num_seqs","flags_key"],["kv_cache_usage_ratio",'
    b'"generation_tokens_per_second","requests_per_second","ttft_p50_seconds","ttft_p95_seconds",'
    b'"ttft_p99_seconds","itl_p50_seconds","itl_p95_seconds","itl_p99_seconds","e2e_p99_seconds",'
    b'"cpu_percent","canary_ttft_seconds"],{"window":{"ended_at":"2026-01-01T00:00:00.000000Z","seconds":5.0,'
    b'"steps":0.0,"ttft":{"bounds":[0.001,0.005,0.01,0.02,0.04,0.06,0.08,0.1,0.25,0.5,0.75,1.0,2.5,5.0,7.5,'
    b'10.0,20.0,40.0,80.0,160.0,640.0,2560.0],"counts":[0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,'
    b'0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0]},"itl":{"bounds":[0.01,0.025,0.05,0.075,0.1,0.15,0.2,0.3,0.4,'
    b'0.5,0.75,1.0,2.5,5.0,7.5,10.0,20.0,40.0,80.0],"counts":[0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,'
    b'0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0]}}}]]'
)

Subject = tuple[str, str]  # (kind, name): ("replica", "r0"), ("gpu", "0")
Values = dict[str, Any]


class PackError(ValueError):
    """A stored value this build cannot read (corrupt, or written in a layout it does not know)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# The integer widths a whole number may take (``struct`` letters, little-endian).
_INT_LETTERS = "BHIq"


def _width(number: float) -> str:
    """The letter of the narrowest integer that holds ``number`` exactly, or "" where only a float does (a
    fraction, infinity, NaN, minus zero, or beyond 64 bits)."""
    if not number.is_integer():
        return ""
    if number >= 0:
        if number <= 0xFF:
            return "B" if number or math.copysign(1.0, number) > 0 else ""
        if number <= 0xFFFF:
            return "H"
        if number <= 0xFFFF_FFFF:
            return "I"
        return "q" if number < 2.0**63 else ""
    return "q" if number >= -(2.0**63) else ""


def _split(values: Mapping[str, Any]) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """One subject's numbers as floats, in order, by name; and its other values (lists, a bool). A None is left
    out (absent, as a field the agent did not send)."""
    numbers: list[tuple[str, float]] = []
    other: dict[str, Any] = {}
    for name, value in values.items():
        if _is_number(value):
            numbers.append((name, float(value)))
        elif value is not None:
            other[name] = value
    return numbers, other


def _sealed(form: int, body: bytes, level: int, dictionary: bytes) -> bytes:
    packer = zlib.compressobj(level, zdict=dictionary)
    return bytes([form]) + packer.compress(body) + packer.flush()


def pack(samples: Iterable[tuple[str, str, Mapping[str, Any]]]) -> bytes:
    """``(kind, subject, values)`` for each subject of one node at one instant, as one stored value.

    Numbers go into the integer or the float part (an int comes back as a float); anything else (lists, a
    bool) into the head, by name; a None is left out (absent, as a field the agent did not send)."""
    head: list[list[Any]] = []
    letters: list[str] = []
    whole: list[int] = []
    floats: list[float] = []
    for kind, subject, values in samples:
        numbers, other = _split(values)
        whole_names: list[str] = []
        float_names: list[str] = []
        for name, number in numbers:
            letter = _width(number)
            if letter:
                whole_names.append(name)
                letters.append(letter)
                whole.append(int(number))
            else:
                float_names.append(name)
                floats.append(number)
        entry = [kind, subject, whole_names, float_names]
        head.append([*entry, other] if other else entry)
    codes = "".join(letters)
    plain = struct.pack(f"<{len(floats)}d", *floats)
    body = b"".join((json.dumps(head, separators=(",", ":")).encode(), _HEAD_END, codes.encode(), _HEAD_END,
                     struct.pack(f"<{codes}", *whole), *(plain[k::8] for k in range(8))))
    return _sealed(FORMAT, body, _LEVEL, _DICTIONARY_2)


def pack_format_1(samples: Iterable[tuple[str, str, Mapping[str, Any]]]) -> bytes:
    """``pack`` as format 1 wrote it: every number an 8-byte float in the head's order. Only for the migrations
    that leave a store as the builds before format 2 read it."""
    head: list[list[Any]] = []
    numbers: list[float] = []
    for kind, subject, values in samples:
        named, other = _split(values)
        fields = [name for name, _ in named]
        numbers += [number for _, number in named]
        head.append([kind, subject, fields, other] if other else [kind, subject, fields])
    body = json.dumps(head, separators=(",", ":")).encode() + _HEAD_END + struct.pack(f"<{len(numbers)}d", *numbers)
    return _sealed(FORMAT_1, body, 6, _NAMES)


def unpack(blob: bytes) -> list[tuple[str, str, Values]]:
    """The ``(kind, subject, values)`` that ``pack`` stored, in the same order."""
    form = blob[0] if blob else None
    if form not in _READERS:
        raise PackError(f"stored samples in an unknown format ({blob[:1].hex() or 'empty'})")
    dictionary, read = _READERS[form]
    try:
        reader = zlib.decompressobj(zdict=dictionary)
        body = reader.decompress(blob[1:]) + reader.flush()
        if not reader.eof:
            raise ValueError("the value is cut short")
        split = body.index(_HEAD_END)
        return read(json.loads(body[:split]), body[split + 1:])
    except (zlib.error, ValueError, struct.error, TypeError, IndexError) as exc:
        raise PackError(f"stored samples could not be read: {exc}") from exc


def _read_format_2(head: list[list[Any]], rest: bytes) -> list[tuple[str, str, Values]]:
    split = rest.index(_HEAD_END)
    codes = rest[:split].decode("ascii")
    if codes.strip(_INT_LETTERS):
        raise ValueError("unknown integer widths")
    size = struct.calcsize(f"<{codes}")
    whole = list(map(float, struct.unpack(f"<{codes}", rest[split + 1:split + 1 + size])))
    planes = rest[split + 1 + size:]
    count, left = divmod(len(planes), 8)
    if left:
        raise ValueError("the floats are cut short")
    plain = bytearray(len(planes))
    for k in range(8):
        plain[k::8] = planes[k * count:(k + 1) * count]
    floats = struct.unpack(f"<{count}d", plain)
    out: list[tuple[str, str, Values]] = []
    at_whole = at_float = 0
    for entry in head:
        whole_names, float_names = entry[2], entry[3]
        # A short slice (too few numbers) shows in the totals below.
        end_whole, end_float = at_whole + len(whole_names), at_float + len(float_names)
        values: Values = dict(zip(whole_names, whole[at_whole:end_whole], strict=False))
        values.update(zip(float_names, floats[at_float:end_float], strict=False))
        at_whole, at_float = end_whole, end_float
        if len(entry) > 4:
            values.update(entry[4])
        out.append((entry[0], entry[1], values))
    if at_whole != len(whole) or at_float != len(floats):
        raise ValueError("the numbers do not match their names")
    return out


def _read_format_1(head: list[list[Any]], raw: bytes) -> list[tuple[str, str, Values]]:
    numbers = struct.unpack(f"<{len(raw) // 8}d", raw)
    out: list[tuple[str, str, Values]] = []
    at = 0
    for entry in head:
        kind, subject, fields = entry[0], entry[1], entry[2]
        values: Values = dict(zip(fields, numbers[at:at + len(fields)], strict=True))
        at += len(fields)
        if len(entry) > 3:
            values.update(entry[3])
        out.append((kind, subject, values))
    if at != len(numbers):
        raise ValueError("the numbers do not match their names")
    return out


Reader = Callable[[list[list[Any]], bytes], list[tuple[str, str, Values]]]
# Each format's preset dictionary and what reads the rest of its body after the JSON head.
_READERS: dict[int | None, tuple[bytes, Reader]] = {FORMAT_1: (_NAMES, _read_format_1),
                                                     FORMAT: (_DICTIONARY_2, _read_format_2)}


def subjects(blob: bytes) -> dict[Subject, Values]:
    """``unpack`` as a mapping by ``(kind, subject)``."""
    return {(kind, subject): values for kind, subject, values in unpack(blob)}
