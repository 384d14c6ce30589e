"""The demo's fault timeline: which replica breaks how and when, what Pitstop is expected to do about it, and
the timeline of what it did, read back from the control plane.

Pure but for ``write_overlay`` (files) and the timeline's inputs, which the caller fetches. Times are seconds on
the fault clock: its zero is the moment the demo's fleet is up, written to ``fault-clock`` for the engines
(``enginesim/faults.py``: ``--fault-clock-file``) and the load, so an engine that replaces a wedged one does not
wedge again. ``scale`` shortens the timeline (and, labelled, the policy windows with it) for tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from controlplane.policy_files import DEFAULTS_DIR

MIB = 2**20
# The leak is sized to the host: it would reach 95 % of its memory in this long, inside rss-leak's 24 h horizon.
LEAK_EXHAUSTS_IN_MIN = 12 * 60
WEDGE, LEAK, HOT_GPU, SURGE = "wedge", "leak", "hot_gpu", "latency_surge"
# With the H100 profile, 36 streams a replica at max-num-seqs 64 read ~215 ms ITL, over itl-slo's 200 ms; the
# governor's proportional step predicts 16, where ITL is ~100 ms (the virtual clock of enginesim.virtual_load),
# leaving room for a busy host's lag: the agent's p99 comes from vLLM's buckets (.1 .15 .2 .3), and a reading past
# 200 ms in a tenth of a minute is still a breach.
SURGE_CLIENTS_PER_REPLICA = 36
SURGE_MS_PER_SEQ = 5.5


@dataclass(frozen=True)
class Fault:
    """One injected fault and what Pitstop should do about it."""

    key: str
    what: str
    at: float  # seconds on the fault clock
    replica: str | None  # None: every replica
    policies: tuple[str, ...]
    kinds: tuple[str, ...]
    env: Mapping[str, str]


def leak_mb_per_min(host_memory_bytes: int) -> float:
    """A leak rate that reaches 95 % of this host's memory within ``LEAK_EXHAUSTS_IN_MIN`` minutes."""
    return max(8.0, round(host_memory_bytes * 0.95 / 1e6 / LEAK_EXHAUSTS_IN_MIN))


def fault_plan(replicas: Sequence[str], scale: float, host_memory_bytes: int) -> list[Fault]:
    """The default timeline, all of it within five minutes at scale 1, each fault on its own replica."""
    if len(replicas) < 4:
        raise ValueError("the fault timeline needs 4 replicas (one wedges, one leaks, one runs hot, and the "
                         "disruption budget keeps half of them READY)")
    wedged, leaking, hot = replicas[0], replicas[1], replicas[2]
    leak = leak_mb_per_min(host_memory_bytes)
    env = "PITSTOP_SIM_FAULT_"
    return [
        Fault(WEDGE, f"{wedged} wedges: /health stays 200, no token comes out", 15 * scale, wedged, ("stall",),
              ("restart",), {f"{env}HANG_AFTER": f"{15 * scale:g}", f"{env}HANG_GAUGES": "zero"}),
        Fault(LEAK, f"{leaking} leaks host memory, {leak:g} MB/min", 0.0, leaking, ("rss-leak",),
              ("planned_restart",), {f"{env}LEAK_RSS_MB_PER_MIN": f"{leak:g}", f"{env}LEAK_AFTER": "0"}),
        Fault(HOT_GPU, f"GPU of {hot} runs hot, past its slowdown temperature", 30 * scale, hot,
              ("thermal", "thermal-sustained"), ("alert", "cordon"), {f"{env}HOT_GPU_AFTER": f"{30 * scale:g}"}),
        Fault(SURGE, f"latency surge: {SURGE_CLIENTS_PER_REPLICA * len(replicas)} more streams of long-context "
              f"traffic, every decode step {SURGE_MS_PER_SEQ:g} ms slower per sequence in the batch", 100 * scale,
              None, ("itl-slo",), ("lower_max_num_seqs",),
              {f"{env}LATENCY_SURGE_AFTER": f"{100 * scale:g}",
               f"{env}LATENCY_SURGE_MS_PER_SEQ": f"{SURGE_MS_PER_SEQ:g}"}),
    ]


def engine_env(faults: Sequence[Fault], replica: str, clock_file: Path) -> dict[str, str]:
    """The fault variables of one replica's engine."""
    env = {"PITSTOP_SIM_FAULT_CLOCK_FILE": str(clock_file)}
    for fault in faults:
        if fault.replica in (None, replica):
            env.update(fault.env)
    return env


@dataclass(frozen=True)
class Overlay:
    """A shipped policy's window cut so the timeline fits, or a server setting; printed at start."""

    policy: str | None  # None: a server setting
    path: tuple[str, ...]
    shipped: str
    demo: str


def _fmt(seconds: float) -> str:
    return f"{seconds:g}s"


def overlays(scale: float) -> list[Overlay]:
    """What the demo changes: always rss-leak's 9-minute window, the canary window, and stall's 2 minutes (the
    restart must come before the latency surge's rollout, which would restart the wedged replica with the others);
    at a scale below 1, the other windows the timeline waits on too."""
    out = [Overlay("stall", ("condition", "for"), "2m", _fmt(30 * scale)),
           Overlay("rss-leak", ("condition", "min_window"), "9m", _fmt(60 * scale)),
           Overlay("rss-leak", ("condition", "min_samples"), "20", "10"),
           Overlay(None, ("canary_window_seconds",), "120s", _fmt(60 * scale))]
    if scale < 1:
        out += [Overlay("thermal", ("condition", "for"), "2m", _fmt(120 * scale)),
                Overlay("itl-slo", ("condition", "for"), "60s", _fmt(60 * scale))]
    return out


def _value(text: str) -> Any:
    return int(text) if text.isdigit() else text


def write_overlay(dest: Path, items: Sequence[Overlay]) -> dict[str, Any]:
    """Copies of the shipped policies with the overlay's values in ``dest`` (a policy named like a default replaces
    it); returns the server settings of the overlay."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.yaml"):
        old.unlink()
    docs: dict[str, dict[str, Any]] = {}
    settings: dict[str, Any] = {}
    for item in items:
        if item.policy is None:
            settings[item.path[-1]] = float(item.demo.removesuffix("s"))
            continue
        doc = docs.setdefault(item.policy, yaml.safe_load((DEFAULTS_DIR / f"{item.policy}.yaml").read_text()))
        node = doc
        for part in item.path[:-1]:
            node = node[part]
        node[item.path[-1]] = _value(item.demo)
    for name, doc in docs.items():
        doc["description"] = f"DEMO OVERLAY (windows cut to fit the demo) - {doc.get('description', '')}"
        (dest / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return settings


def overlay_lines(items: Sequence[Overlay]) -> list[str]:
    return [f"  {item.policy or 'server'}: {'.'.join(item.path)} {item.shipped} -> {item.demo}" for item in items]


# -- the timeline ----------------------------------------------------------------------------------------------
def _at(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def _matches(fault: Fault, action: Mapping[str, Any], gpu_of: Mapping[str, int]) -> bool:
    """One of the fault's policies acting on its replica (or that replica's GPU, or its node): the expected kind
    of action, or the alert a policy's ``notify`` raises beside it."""
    if action.get("policy") not in fault.policies or action.get("kind") not in (*fault.kinds, "alert"):
        return False
    if fault.replica is None:
        return True
    if action.get("replica") == fault.replica:
        return True
    target = str(action.get("target", ""))
    if target.startswith("gpu:") and fault.replica in gpu_of:
        return target.rsplit("/", 1)[-1] == str(gpu_of[fault.replica])
    return target.startswith("node:") and fault.key == HOT_GPU


def timeline(faults: Sequence[Fault], clock: float, actions: Sequence[Mapping[str, Any]],
             events: Sequence[Mapping[str, Any]], gpu_of: Mapping[str, int], now: float) -> dict[str, Any]:
    """For each fault that came due: when it happened, when Pitstop saw it, what it did and how that went; and
    every other action of the run. ``actions``/``events`` are the control plane's API answers."""
    used: set[int] = set()
    rows: list[dict[str, Any]] = []
    live = [a for a in actions if a.get("state") != "suppressed"]
    for fault in faults:
        fault_at = clock + fault.at
        if fault_at > now:
            continue
        mine = sorted((a for a in live if _matches(fault, a, gpu_of) and (_at(a["created_at"]) or 0) >= fault_at
                       and a["id"] not in used), key=lambda a: a["id"])
        used.update(a["id"] for a in mine)
        first = next((a for a in mine if a.get("kind") in fault.kinds), None)
        detected = _at(first["created_at"]) if first else None
        if fault.key == WEDGE:
            # The agent's verdict is the detection: readiness goes off then, before the control plane acts.
            wedged = [_at(e["at"]) for e in events if e.get("replica") == fault.replica
                      and e.get("to_state") == "WEDGED" and (_at(e["at"]) or 0) >= fault_at]
            detected = min((w for w in wedged if w is not None), default=detected)
        rows.append({
            "fault": fault.key, "what": fault.what, "replica": fault.replica or "all",
            "fault_at": fault_at, "detected_at": detected,
            "acted_at": (_at(first.get("started_at")) or _at(first["created_at"])) if first else None,
            "action": _action(first) if first else None,
            "actions": [_action(a) for a in mine],
            "expected_kinds": list(fault.kinds),
        })
    others = [_action(a) for a in sorted(live, key=lambda a: a["id"]) if a["id"] not in used]
    held = sum(1 for a in actions if a.get("state") == "suppressed")
    return {"clock": clock, "faults": rows, "other_actions": others, "suppressed": held}


def _action(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": a["id"], "policy": a.get("policy"), "kind": a.get("kind"), "target": a.get("target"),
            "state": a.get("state"), "outcome": a.get("outcome") or "", "reason": a.get("reason") or "",
            "created_at": _at(a.get("created_at")), "started_at": _at(a.get("started_at")),
            "finished_at": _at(a.get("finished_at"))}


def _rel(clock: float, at: float | None) -> str:
    return "-" if at is None else f"t+{at - clock:5.0f}s"


def render(doc: Mapping[str, Any], load: Mapping[str, Any] | None) -> list[str]:
    """The printed timeline."""
    clock = float(doc["clock"])
    lines = [f"Timeline (t+0 = {datetime.fromtimestamp(clock).strftime('%H:%M:%S')}, when the fleet was up):"]
    for row in doc["faults"]:
        lines.append(f"- {row['what']}")
        lines.append(f"    fault {_rel(clock, row['fault_at'])}   detected {_rel(clock, row['detected_at'])}   "
                     f"acted {_rel(clock, row['acted_at'])}")
        if row["action"] is None:
            lines.append(f"    no action yet (expected: {', '.join(row['expected_kinds'])})")
        for a in row["actions"]:
            lines.append(f"    #{a['id']} {a['policy']}: {a['kind']} {a['target']} -> {a['state']}"
                         + (f" at {_rel(clock, a['finished_at'])}" if a["finished_at"] else "")
                         + (f": {a['outcome']}" if a["outcome"] else ""))
    if doc["other_actions"]:
        lines.append("- also:")
        for a in doc["other_actions"]:
            lines.append(f"    #{a['id']} {a['policy']}: {a['kind']} {a['target']} -> {a['state']} "
                         f"(at {_rel(clock, a['created_at'])}){': ' + a['outcome'] if a['outcome'] else ''}")
    if doc.get("suppressed"):
        lines.append(f"  ({doc['suppressed']} repeated proposal(s) held back by the guardrails: cooldowns)")
    if load is not None:
        retried = ", ".join(f"{n} {why}" for why, n in sorted(load.get("attempts_failed", {}).items())) or "none"
        lines.append(f"Load: {load.get('requests_ok', 0)} requests ok, {load.get('requests_failed', 0)} failed; "
                     f"{load.get('requests_retried', 0)} completed on another replica after a failed attempt "
                     f"(failed attempts: {retried}); {load.get('in_flight', 0)} cut off by the stop")
    return lines
