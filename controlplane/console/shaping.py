"""API JSON → console tables. Pure: no Streamlit, no HTTP, so every column is unit-testable.

Each ``*_rows`` function returns a list of flat dicts whose keys are the column headers the page shows, in
order; missing readings become ``None`` (shown blank), never a made-up zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

Json = Mapping[str, Any]
GIB = 1024**3
MIB = 1024**2


def _ms(seconds: Any) -> float | None:
    return None if seconds is None else round(float(seconds) * 1000.0, 1)


def _pct(ratio: Any) -> float | None:
    return None if ratio is None else round(float(ratio) * 100.0, 1)


def _scaled(value: Any, unit: int, digits: int = 1) -> float | None:
    return None if value is None else round(float(value) / unit, digits)


def _parse_time(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


def age_text(seconds: float | None) -> str:
    """Compact age for a table cell: 4s, 3m 20s, 2h 5m, 3d 4h."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def node_rows(nodes: Sequence[Json]) -> list[dict[str, Any]]:
    return [
        {
            "node": n["name"],
            "status": n["status"],
            "last report": age_text(n.get("last_report_age_seconds")),
            "host": n.get("hostname"),
            "agent": n.get("agent_version"),
            "GPUs": n.get("gpu_count", 0),
            "replicas": n.get("replica_count", 0),
            "cordoned": bool(n.get("cordoned")),
        }
        for n in nodes
    ]


def gpu_rows(gpus: Sequence[Json]) -> list[dict[str, Any]]:
    rows = []
    for g in gpus:
        temp, slowdown = g.get("temperature_celsius"), g.get("slowdown_temperature_celsius")
        rows.append({
            "node": g["node"],
            "GPU": g["index"],
            "name": g.get("name"),
            # Fenced on its own (a GPU cordon): the replicas on it are drained and kept stopped.
            "cordoned": bool(g.get("cordoned")),
            "temp °C": temp,
            "slowdown °C": slowdown,
            # Headroom to the GPU's own slowdown threshold (read from NVML, not assumed).
            "headroom °C": None if temp is None or slowdown is None else round(slowdown - temp, 1),
            "mem used GiB": _scaled(g.get("memory_used_bytes"), GIB),
            "mem total GiB": _scaled(g.get("memory_total_bytes"), GIB),
            "util %": _pct(g.get("utilization_ratio")),
            "power W": g.get("power_watts"),
            "throttle": ", ".join(g.get("throttle_reasons") or []),
        })
    return rows


# Replica states that need a person's eyes (crash loops and give-ups), from the agent's state machine.
TROUBLED_STATES = frozenset({"BACKOFF", "FATAL", "UNREACHABLE"})
# Out of rotation by the agent's own verdict: answers /health, makes no progress (docs/design.md, "Progress").
WEDGED_STATE = "WEDGED"
# Warn this close to the GPU's own slowdown threshold (NVML reports it per board; never assume 85 °C).
GPU_HEADROOM_WARN_CELSIUS = 5.0


def attention(nodes: Sequence[Json], replicas: Sequence[Json], gpus: Sequence[Json]) -> list[str]:
    """One line per thing an operator should look at now, most severe kinds first."""
    lines = [f"node {n['name']} has not reported for {age_text(n.get('last_report_age_seconds'))}"
             for n in nodes if n.get("status") == "stale"]
    for r in replicas:
        where = f"{r['node']}/{r['name']}"
        if r.get("state") == WEDGED_STATE:
            lines.append(f"replica {where} is WEDGED: out of rotation, canaries fail and no token moves")
        elif r.get("state") in TROUBLED_STATES:
            lines.append(f"replica {where} is {r['state']} after {r.get('restarts_total', 0)} restarts")
        engine: Json = r.get("engine") or {}
        if engine.get("stalled"):
            lines.append(f"replica {where} has queued work but generates no tokens (stalled engine)")
    for g in gpus:
        temp, slowdown = g.get("temperature_celsius"), g.get("slowdown_temperature_celsius")
        if temp is not None and slowdown is not None and slowdown - temp <= GPU_HEADROOM_WARN_CELSIUS:
            lines.append(f"GPU {g['node']}#{g['index']} at {temp:g} °C, slowdown at {slowdown:g} °C")
    return lines


def replica_detail(replica: Json) -> dict[str, Any]:
    """Facts about one replica for its detail panel: how long in this state, how it last exited, its args."""
    canary, since = replica.get("canary_ok"), _parse_time(replica.get("state_since"))
    exit_code, canary_ms = replica.get("last_exit_code"), _ms(replica.get("canary_ttft_seconds"))
    # One row of text: blanks read better than "None" here.
    return {
        "state": replica["state"],
        "since": "" if since is None else since.strftime("%Y-%m-%d %H:%M:%S"),
        "generation": replica.get("generation", 0),
        "last exit code": "" if exit_code is None else str(exit_code),
        "canary": "" if canary is None else ("ok" if canary else "FAILED"),
        "canary TTFT ms": "" if canary_ms is None else f"{canary_ms:g}",
        "engine args": " ".join(replica.get("engine_args") or []),
        "url": replica.get("url"),
        "log tail": "\n".join(replica.get("log_tail") or []),
    }
