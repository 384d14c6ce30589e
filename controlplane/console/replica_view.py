"""The Replicas page as data: the table, its page and filters, one replica's timeline, stack dump and series. Pure.

The table is paged by the control plane (``GET /v1/replicas?view=table``): a fleet of thousands is megabytes to
read whole, and a person reads a page of it. The filters, the order and the page are the request's; the answer
says how many match, and which models, nodes and states the fleet has to filter by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controlplane.console import projection
from controlplane.console.shaping import (
    MIB,
    TROUBLED_STATES,
    WEDGED_STATE,
    Json,
    _ms,
    _parse_time,
    _pct,
    age_text,
    attention,
)
from controlplane.policy.detectors.leak import gpus_memory_total

# States an engine process runs in: their time since state_since is the replica's uptime.
RUNNING = frozenset({"READY", "WARMING", "WEDGED", "DRAINING", "ATTACHED"})
# (sample field, series name) per chart. Latency: one line per quantile the agent reads over its window, named
# alike in every latency chart so the palette gives p99 one colour; the engine's end-to-end latency is p99 only.
TTFT = (("ttft_p50_seconds", "p50"), ("ttft_p95_seconds", "p95"), ("ttft_p99_seconds", "p99"))
ITL = (("itl_p50_seconds", "p50"), ("itl_p95_seconds", "p95"), ("itl_p99_seconds", "p99"))
E2E = (("e2e_p99_seconds", "p99"),)
TOKENS = (("generation_tokens_per_second", "tokens/s"),)
QUEUE = (("requests_running", "running"), ("requests_waiting", "waiting"))
WINDOWS = {"15 min": 900, "1 h": 3600, "6 h": 6 * 3600, "24 h": 24 * 3600}
# The most points one chart reads (one request each). At the defaults a 24 h window holds about 2,100 (an hour
# of 5 s reports, then one-minute averages); the endpoint answers the newest.
CHART_POINTS = 2000
_IDLE = "the engine was not serving, or the agent could not read its metrics"


@dataclass(frozen=True)
class Chart:
    """One chart of the replica page: its caption, its points, and the line said in its place when it has none."""

    title: str
    points: list[dict[str, Any]]
    unit: str
    empty: str
    quantiles: bool = False  # coloured by the palette's quantile scale
    limit: float | None = None  # drawn as a dashed rule across the chart
    limit_label: str = ""
    # The fitted trend dashed on from the last point (``projection.line``), and the line said under the chart.
    projection: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""


def key(r: Json) -> str:
    return f"{r['node']}/{r['name']}"


def live_cap_text(limits: Json | None) -> str:
    """The live cap as a cell: "32 of 64" (the cap asked of the engine's startup limit; "taking" until the engine's
    next step has it), "not active: why", or nothing where live limits are off."""
    if not limits:
        return ""
    if not limits.get("active"):
        return f"not active: {limits.get('reason') or 'no reason given'}"
    startup = limits.get("startup_limit")
    asked = limits.get("asked")
    want = startup if asked is None else asked if startup is None else min(asked, startup)
    taking = limits.get("cap") is not None and want is not None and limits.get("cap") != want
    return f"{want} of {startup}" + (" (taking)" if taking else "")


def table_rows(replicas: Sequence[Json]) -> list[dict[str, Any]]:
    """One row per replica; uptime is as of its last report (a quiet node's replicas do not age on)."""
    rows = []
    for r in replicas:
        now = _parse_time(r.get("updated_at"))
        engine: Json = r.get("engine") or {}
        process: Json = r.get("process") or {}
        since = _parse_time(r.get("state_since"))
        state = r["state"] + (" (stale)" if r.get("node_status") == "stale" else "")
        rss = process.get("rss_bytes")
        rows.append({
            "replica": key(r), "model": r["model"], "node": r["node"],
            "GPU": ",".join(str(g) for g in r.get("gpus") or []), "state": state,
            "gen": r.get("generation", 0),
            "TTFT p99 ms": _ms(engine.get("ttft_p99_seconds")), "ITL p99 ms": _ms(engine.get("itl_p99_seconds")),
            "queue": engine.get("requests_waiting"), "KV %": _pct(engine.get("kv_cache_usage_ratio")),
            "RSS MiB": None if rss is None else round(rss / MIB), "restarts": r.get("restarts_total", 0),
            "live cap": live_cap_text(r.get("live_limits")),
            "uptime": age_text((now - since).total_seconds()) if since and now and r["state"] in RUNNING else "",
            # Last: a long flag list would push the readings out of sight.
            "engine flags": " ".join(r.get("engine_args") or []),
        })
    return rows


# Rows per page of the table, and its orders: the label shown, and the API's sort (the first is the default).
PAGE_ROWS = 200
SORTS = {
    "node, name": "node",
    "model": "model",
    "state": "state",
    "TTFT p99, slowest first": "-ttft_p99_seconds",
    "ITL p99, slowest first": "-itl_p99_seconds",
    "queue, longest first": "-requests_waiting",
    "KV cache, fullest first": "-kv_cache_usage_ratio",
    "RSS, largest first": "-rss_bytes",
    "restarts, most first": "-restarts_total",
    "longest in its state": "state_since",
}
# The states whose replicas the page names above the table wherever they are in the fleet, at most this many.
ATTENTION_STATES = tuple(sorted(TROUBLED_STATES | {WEDGED_STATE}))
ATTENTION_ROWS = 20


def table_query(*, models: Sequence[str] = (), nodes: Sequence[str] = (), states: Sequence[str] = (),
                text: str = "", sort: str = "", page: int = 1) -> dict[str, Any]:
    """The ``GET /v1/replicas`` parameters of one page of the table: each filter with several values a tuple (one
    repeated parameter), None when not set; ``sort`` a label of ``SORTS`` (an unknown one: the default)."""
    return {"view": "table", "model": tuple(models) or None, "node": tuple(nodes) or None,
            "state": tuple(states) or None, "q": text.strip() or None, "sort": SORTS.get(sort, "node"),
            "offset": (max(page, 1) - 1) * PAGE_ROWS, "limit": PAGE_ROWS}


def pages(total: int) -> int:
    return max(1, -(-total // PAGE_ROWS))


def showing(table: Json) -> str:
    """"showing N of M": the rows of this page among the replicas that match, the fleet's count when a filter
    leaves some out, and which rows these are when there is more than one page."""
    rows, total, offset = len(table.get("replicas") or ()), int(table.get("total") or 0), int(table.get("offset") or 0)
    fleet = sum(((table.get("facets") or {}).get("state") or {}).values())
    line = (f"showing {rows} of {total} replicas" if total >= fleet
            else f"showing {rows} of {total} matching replicas ({fleet} in all)")
    if rows and rows < total:
        line += f" · rows {offset + 1} to {offset + rows}, page {offset // PAGE_ROWS + 1} of {pages(total)}"
    return line


def options(facet: Mapping[str, int], chosen: Sequence[str]) -> list[str]:
    """A filter's choices: every value the fleet has, and any still chosen that it no longer has."""
    return sorted(set(facet) | set(chosen))


def attention_lines(trouble: Json | None, shown: Sequence[Json]) -> list[str]:
    """The warnings above the table: every replica in an ``ATTENTION_STATES`` state anywhere in the fleet
    (``trouble``: the table read of those states), then any shown whose engine stalls; a count past the first
    ``ATTENTION_ROWS``."""
    named: dict[str, Json] = {}
    for r in [*((trouble or {}).get("replicas") or ()), *shown]:
        named.setdefault(key(r), r)
    lines = attention([], list(named.values()), [])
    more = int((trouble or {}).get("total") or 0) - len((trouble or {}).get("replicas") or ())
    if more > 0:
        states = f"{', '.join(ATTENTION_STATES[:-1])} or {ATTENTION_STATES[-1]}"
        lines.append(f"and {more} more replicas {states}: filter by state to see them all")
    return lines


def timeline_rows(events: Sequence[Json]) -> list[dict[str, Any]]:
    """State changes and notes, oldest first, for the state timeline chart and its table."""
    rows = []
    for e in sorted(events, key=lambda e: str(e.get("at"))):
        if e.get("kind") == "stack_dump":
            continue
        rows.append({"at": _parse_time(e.get("at")), "state": e.get("to_state") or "",
                     "from": e.get("from_state") or "", "kind": e.get("kind"),
                     "message": (e.get("message") or "")[:300]})
    return rows


def last_stack_dump(events: Sequence[Json]) -> tuple[datetime | None, str] | None:
    """The newest stack dump the agent sent for this replica (the engine's threads before a restart)."""
    dumps = [e for e in events if e.get("kind") == "stack_dump" and e.get("message")]
    if not dumps:
        return None
    newest = max(dumps, key=lambda e: str(e.get("at")))
    return _parse_time(newest.get("at")), str(newest["message"])


def long_series(samples: Sequence[Json], fields: Sequence[tuple[str, str]], scale: float = 1.0) -> list[dict[str, Any]]:
    """Long-form points (at, series, value) for one Altair chart; a missing reading is left out, not zero."""
    points = []
    for s in samples:
        at = _parse_time(s.get("at"))
        values: Json = s.get("values") or {}
        for reading, name in fields:
            value = values.get(reading)
            if value is not None:
                points.append({"at": at, "series": name, "value": round(float(value) * scale, 3)})
    return points


def memory_chart(samples: Sequence[Json], reading: str, series: str, limit: int | None, *, title: str,
                 owner: str, empty: str) -> Chart:
    """One memory series against the limit the leak detector projects it to (``limit``, None: not reported),
    with the detector's trend dashed on from the last point and said under the chart (``projection``).
    ``owner``: whose memory the limit is, as the titles say it ("the host's")."""
    trend = projection.fit(samples, reading, limit)
    points, line = long_series(samples, ((reading, series),), 1 / MIB), projection.line(trend)
    note = projection.caption(trend, series, owner)
    if limit is None:
        return Chart(f"{title}; {owner} memory total is not reported", points, "MiB", empty, projection=line,
                     note=note)
    size = projection.gib_text(limit)
    return Chart(f"{title}, against {owner} {size}", points, "MiB", empty, limit=limit / MIB,
                 limit_label=f"{owner} {size}", projection=line, note=note)


def replica_charts(samples: Sequence[Json], *, host_memory: int | None = None,
                   gpus: Sequence[Json | None] = ()) -> list[Chart]:
    """The replica's series charts, latency first. A reading the window never had is said, not drawn empty: an
    engine that is not serving sends no latency, and an agent older than the p50/p95 draws only the p99 line.
    ``host_memory``: its node's memory total; ``gpus``: the latest reading of each GPU it lists (None: not read),
    whose memory together is what its GPU memory would exhaust."""
    gpu_total = gpus_memory_total((g or {}).get("memory_total_bytes") for g in gpus)
    gpu_owner = "the GPU's" if len(gpus) == 1 else f"its {len(gpus)} GPUs'" if gpus else "its GPUs'"
    return [
        Chart("Time to first token p50 / p95 / p99 (ms)", long_series(samples, TTFT, 1000), "ms",
              f"No time to first token in this window: {_IDLE}.", quantiles=True),
        Chart("Inter-token latency p50 / p95 / p99 (ms)", long_series(samples, ITL, 1000), "ms",
              f"No inter-token latency in this window: {_IDLE}.", quantiles=True),
        Chart("End-to-end request latency p99 (ms)", long_series(samples, E2E, 1000), "ms",
              f"No end-to-end latency in this window: {_IDLE}.", quantiles=True),
        Chart("Tokens generated per second", long_series(samples, TOKENS), "tokens/s",
              f"No token rate in this window: {_IDLE}."),
        Chart("Queue (requests)", long_series(samples, QUEUE), "requests", f"No queue in this window: {_IDLE}."),
        memory_chart(samples, "rss_bytes", "RSS", host_memory, title="RSS of the engine's processes (MiB)",
                     owner="the host's",
                     empty="No RSS reading in this window: the agent could not read the engine's processes."),
        memory_chart(samples, "gpu_memory_bytes", "GPU memory", gpu_total,
                     title="GPU memory of the engine's processes (MiB)", owner=gpu_owner,
                     empty="No GPU memory reading in this window: the agent's GPU backend reads no per-process "
                           "memory."),
    ]


def temperature_chart(index: int, samples: Sequence[Json], gpu: Json | None) -> Chart:
    """One GPU's temperature over the window against its own slowdown threshold (NVML's, from its latest
    reading, ``gpu``): 84 °C is headroom on one board and throttling on another."""
    slowdown = None if gpu is None else gpu.get("slowdown_temperature_celsius")
    points = long_series(samples, (("temperature_celsius", f"GPU {index}"),))
    empty = f"No temperature recorded for GPU {index} in this window."
    if slowdown is None:
        return Chart(f"GPU {index} temperature (°C); the GPU reports no slowdown threshold", points, "°C", empty)
    return Chart(f"GPU {index} temperature (°C); dashed: it slows down at {slowdown:g} °C", points, "°C", empty,
                 limit=float(slowdown), limit_label=f"slowdown {slowdown:g} °C")
