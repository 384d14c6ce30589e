"""``pack`` and ``unpack``: one node's samples at one instant as one compact value (docs/design.md, "The store").

A report carries a sample of every replica and every GPU on its node, all at the report's time. Stored one row
per subject, as JSON text, each reading cost about 1 KB on disk: the field names, the digits of every number
as text, and a row and an index entry per subject. Packed, a node's report is one row:

- a small JSON head naming each subject and its fields in order, with the values that are not numbers (a GPU's
  XID codes and throttle reasons) beside them;
- every number as an 8-byte float, in the order the head names them (exact: counters are compared for
  equality, and a 4-byte float would round a token counter past 16 million);
- the two compressed together, with a preset dictionary of the field names known when the format was set
  (``_NAMES``): the names then cost a few bytes a subject, and settings that repeat across a node's replicas
  (the generation, the running limit) little more. A name the dictionary lacks is stored all the same, at the
  cost of its letters.

A leading format byte lets a later layout be told from this one; ``unpack`` refuses one it does not know
rather than misreading it.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

FORMAT = 1
_HEAD_END = b"\0"  # JSON text never holds a NUL byte
# Fast enough for every report (about 30 microseconds for a node of 8 replicas and 8 GPUs), and within a few
# per cent of the best ratio on these rows.
_LEVEL = 6

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

Subject = tuple[str, str]  # (kind, name): ("replica", "r0"), ("gpu", "0")
Values = dict[str, Any]


class PackError(ValueError):
    """A stored value this build cannot read (corrupt, or written in a layout it does not know)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def pack(samples: Iterable[tuple[str, str, Mapping[str, Any]]]) -> bytes:
    """``(kind, subject, values)`` for each subject of one node at one instant, as one stored value.

    Numbers go into the float array (as floats: an int comes back as a float); anything else (lists, a bool)
    into the head, by name; a None is left out (absent, as a field the agent did not send)."""
    head: list[list[Any]] = []
    numbers: list[float] = []
    for kind, subject, values in samples:
        fields = []
        other: dict[str, Any] = {}
        for name, value in values.items():
            if _is_number(value):
                fields.append(name)
                numbers.append(float(value))
            elif value is not None:
                other[name] = value
        head.append([kind, subject, fields, other] if other else [kind, subject, fields])
    text = json.dumps(head, separators=(",", ":")).encode()
    body = text + _HEAD_END + struct.pack(f"<{len(numbers)}d", *numbers)
    packer = zlib.compressobj(_LEVEL, zdict=_NAMES)
    return bytes([FORMAT]) + packer.compress(body) + packer.flush()


def unpack(blob: bytes) -> list[tuple[str, str, Values]]:
    """The ``(kind, subject, values)`` that ``pack`` stored, in the same order."""
    if not blob or blob[0] != FORMAT:
        raise PackError(f"stored samples in an unknown format ({blob[:1].hex() or 'empty'})")
    try:
        reader = zlib.decompressobj(zdict=_NAMES)
        body = reader.decompress(blob[1:]) + reader.flush()
        if not reader.eof:
            raise ValueError("the value is cut short")
        split = body.index(_HEAD_END)
        head = json.loads(body[:split])
        raw = body[split + 1:]
        numbers = struct.unpack(f"<{len(raw) // 8}d", raw)
    except (zlib.error, ValueError, struct.error) as exc:
        raise PackError(f"stored samples could not be read: {exc}") from exc
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
        raise PackError("stored samples could not be read: the numbers do not match their names")
    return out


def subjects(blob: bytes) -> dict[Subject, Values]:
    """``unpack`` as a mapping by ``(kind, subject)``."""
    return {(kind, subject): values for kind, subject, values in unpack(blob)}
