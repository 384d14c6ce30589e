"""The Nodes & GPUs page as data: one tile per GPU, coloured against the device's own limits. Pure.

Temperature is judged against the GPU's own slowdown threshold as NVML reports it (an H100 and an L4 slow down
at different temperatures: never a fleet-wide 85 °C); memory against the board's total.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.console.palette import badge
from controlplane.console.shaping import GIB, GPU_HEADROOM_WARN_CELSIUS, Json, age_text

# Memory share that is amber, and red: a full board refuses the KV cache a new engine asks for.
MEMORY_AMBER, MEMORY_RED = 0.85, 0.95


def temperature_status(temp: float | None, slowdown: float | None) -> str:
    if temp is None or slowdown is None:
        return "unknown"
    if temp >= slowdown:
        return "red"
    return "amber" if slowdown - temp <= GPU_HEADROOM_WARN_CELSIUS else "green"


def memory_status(used: float | None, total: float | None) -> str:
    if used is None or not total:
        return "unknown"
    share = used / total
    return "red" if share >= MEMORY_RED else "amber" if share >= MEMORY_AMBER else "green"


def gpu_tile(g: Json, fenced: bool | None = None) -> dict[str, Any]:
    """A tile: its title, the two coloured badges, and the lines under them. ``fenced``: whether the control
    plane holds the GPU cordoned (its node's ``cordoned_gpus``), which the button follows; None: as the agent
    reports it. Where the two differ, the agent has yet to apply the change, and the tile says so."""
    applied = bool(g.get("cordoned"))
    fenced = applied if fenced is None else fenced
    temp, slowdown = g.get("temperature_celsius"), g.get("slowdown_temperature_celsius")
    used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
    t_status, m_status = temperature_status(temp, slowdown), memory_status(used, total)
    temp_text = "temp -" if temp is None else f"{temp:g} °C" + (f" / slows at {slowdown:g}" if slowdown else "")
    mem_text = "mem -" if used is None else f"{used / GIB:.0f}" + (f" / {total / GIB:.0f} GiB" if total else " GiB")
    power, limit = g.get("power_watts"), g.get("power_limit_watts")
    util = g.get("utilization_ratio")
    lines = [
        f"util {'-' if util is None else f'{util * 100:.0f}%'} · power "
        + ("-" if power is None else f"{power:.0f}" + (f" / {limit:.0f} W" if limit else " W")),
        "throttle: " + (", ".join(g.get("throttle_reasons") or []) or "none"),
        f"XID events {g.get('xid_events_total', 0)}" + (f" (last {g['last_xid']})" if g.get("last_xid") else "")
        + f" · ECC uncorrected {'-' if g.get('ecc_uncorrected_total') is None else g['ecc_uncorrected_total']}",
    ]
    if fenced:
        lines.append("CORDONED: its replicas are drained and kept stopped" if applied
                     else "CORDONED: its replicas drain once the agent applies it")
    elif applied:
        lines.append("uncordoned: its replicas start again once the agent applies it")
    if g.get("node_status") == "stale":
        lines.append("node not reporting: these readings are old")
    return {"node": g["node"], "index": g["index"], "title": f"GPU {g['index']} · {g.get('name') or ''}",
            "temperature": t_status, "memory": m_status,
            "badges": f"{badge(t_status, temp_text)} {badge(m_status, mem_text)}", "lines": lines,
            "cordoned": fenced}


def worst(*statuses: str) -> str:
    order = ("red", "amber", "green", "unknown")
    return min(statuses, key=order.index)


def by_node(nodes: Sequence[Json], gpus: Sequence[Json]) -> list[dict[str, Any]]:
    """Per node (in the API's order): its line, cordon and status, and its GPU tiles by index, each cordoned as
    the control plane holds it (the node's ``cordoned_gpus``), as the node's own cordon is."""
    out = []
    for n in nodes:
        fences = n.get("cordoned_gpus")
        tiles = [gpu_tile(g, None if fences is None else g["index"] in fences)
                 for g in sorted((g for g in gpus if g["node"] == n["name"]), key=lambda g: g["index"])]
        status = "stale" if n.get("status") == "stale" else "up"
        line = (f"**{n['name']}** ({n.get('hostname')}) · agent {n.get('agent_version')} · last report "
                f"{age_text(n.get('last_report_age_seconds'))} ago · {n.get('replica_count', 0)} replicas")
        out.append({"node": n["name"], "line": line, "status": status, "cordoned": bool(n.get("cordoned")),
                    "tiles": tiles})
    return out
