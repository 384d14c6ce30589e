"""The Replicas page as data: the table and its filters, one replica's timeline, stack dump and series. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from controlplane.console.shaping import MIB, Json, _ms, _parse_time, _pct, age_text

# States an engine process runs in: their time since state_since is the replica's uptime.
RUNNING = frozenset({"READY", "WARMING", "WEDGED", "DRAINING", "ATTACHED"})
# (sample field, series name, unit divisor) per chart: latency quantiles the samples keep, in ms.
LATENCY = (("ttft_p99_seconds", "TTFT p99"), ("itl_p99_seconds", "ITL p99"), ("e2e_p99_seconds", "e2e p99"))
QUEUE = (("requests_running", "running"), ("requests_waiting", "waiting"))
MEMORY = (("rss_bytes", "RSS"), ("gpu_memory_bytes", "GPU memory"))
WINDOWS = {"15 min": 900, "1 h": 3600, "6 h": 6 * 3600, "24 h": 24 * 3600}


def key(r: Json) -> str:
    return f"{r['node']}/{r['name']}"


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
            "uptime": age_text((now - since).total_seconds()) if since and now and r["state"] in RUNNING else "",
            # Last: a long flag list would push the readings out of sight.
            "engine flags": " ".join(r.get("engine_args") or []),
        })
    return rows


def filter_rows(rows: Sequence[dict[str, Any]], *, models: Sequence[str] = (), nodes: Sequence[str] = (),
                states: Sequence[str] = (), text: str = "") -> list[dict[str, Any]]:
    """Rows matching every filter given (empty means any); ``text`` looks in the name and the flags."""
    needle = text.strip().lower()
    return [r for r in rows
            if (not models or r["model"] in models) and (not nodes or r["node"] in nodes)
            and (not states or r["state"].split(" ")[0] in states)
            and (not needle or needle in r["replica"].lower() or needle in r["engine flags"].lower())]


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
        for field, name in fields:
            value = values.get(field)
            if value is not None:
                points.append({"at": at, "series": name, "value": round(float(value) * scale, 3)})
    return points
