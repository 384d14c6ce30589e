"""On-call's commands over SSH: the console's reads and safe actions as a client of the control-plane API.

``pitstop status`` (the Fleet page as tables), ``replicas``, ``actions [--follow]``, and the actions ``restart``,
``drain``, ``rollout``, ``cordon``, ``uncordon`` and ``silence``. Every action first asks the control plane for
a dry run (``?dry_run=true``: the guardrails' decision and blast radius), prints it, and only then, confirmed
(``--yes``, or yes at the prompt), sends the real request; ``--dry-run`` stops after the preview. ``--json``
prints the API's JSON for scripts. Exit codes: ``opsclient.Exit``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from pitstop.opsclient import Exit, OpsError, call

# Terminal states of an action (``policy.lifecycle``): ``--wait`` and ``--follow`` stop watching there.
FINISHED = {"succeeded", "failed", "rolled_back", "rejected", "expired", "suppressed", "shadow"}
WENT_WRONG = {"failed", "rolled_back"}


@dataclass
class Io:
    """Where a command reads and writes; tests pass their own."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    ask: Callable[[str], str] | None = None  # None: no terminal to ask on
    sleep: Callable[[float], None] = time.sleep


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Left-aligned columns; missing readings blank, never a made-up zero."""
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _ms(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds * 1000:.0f}ms"


def _objective(o: Mapping[str, Any]) -> str:
    value, target = o["value"], o["target"]
    if o["name"] == "error_ratio":
        shown = "" if value is None else f"{value * 100:.2f}%"
        limit = "" if target is None else f"/{target * 100:g}%"
    else:
        shown, limit = _ms(value) or "", "" if target is None else f"/{_ms(target)}"
    return f"{shown or '-'}{limit} {o['status']}"


# --- reads --------------------------------------------------------------------------------------------------------


def render_status(summary: Mapping[str, Any]) -> str:
    models = []
    for m in summary["models"]:
        by = {o["name"]: o for o in m["objectives"]}
        models.append({"model": m["model"], "status": m["status"], "ready": f"{m['ready']}/{m['replicas']}",
                       "ttft p99": _objective(by["ttft_p99"]), "itl p99": _objective(by["itl_p99"]),
                       "errors": _objective(by["error_ratio"]), "tokens/s": m["tokens_per_second"],
                       "states": " ".join(f"{k}={v}" for k, v in m["by_state"].items())})
    n, auto = summary["nodes"], summary["automation"]
    breaker = auto["breaker"]
    lines = [table(models, ["model", "status", "ready", "ttft p99", "itl p99", "errors", "tokens/s", "states"])
             if models else "no replica has reported yet", "",
             f"nodes: {n['up']} up, {n['stale']} stale, {n['cordoned']} cordoned (of {n['total']})   "
             f"alerts firing: {summary['alerts_firing']}",
             "automation: " + ("off (policies disabled)" if not auto["policies_enabled"] else
                               f"TRIPPED: {breaker['reason']}" if breaker["tripped"] else
                               f"on, {auto['policies']} policies")
             + (f"; dry run: {', '.join(auto['dry_run'])}" if auto["dry_run"] else "")
             + (f"; need approval: {', '.join(auto['approval'])}" if auto["approval"] else "")]
    if summary["recent_actions"]:
        lines += ["", table(summary["recent_actions"],
                            ["id", "created_at", "kind", "target", "state", "requested_by", "outcome"])]
    return "\n".join(lines)


def replica_rows(replicas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in replicas:
        engine = r.get("engine") or {}
        process = r.get("process") or {}
        rss = process.get("rss_bytes")
        rows.append({"replica": f"{r['node']}/{r['name']}", "model": r["model"], "state": r["state"],
                     "gpus": ",".join(str(g) for g in r["gpus"]), "gen": r["generation"],
                     "ttft p99": _ms(engine.get("ttft_p99_seconds")), "itl p99": _ms(engine.get("itl_p99_seconds")),
                     "queue": engine.get("requests_waiting"), "kv": engine.get("kv_cache_usage_ratio"),
                     "rss GiB": None if rss is None else rss / 1024**3, "restarts": r["restarts_total"],
                     "node": r["node_status"]})
    return rows


def action_line(a: Mapping[str, Any]) -> str:
    progress = ""
    rollout = (a.get("params") or {}).get("rollout")
    if rollout and a.get("replicas"):
        waiting = f"; {rollout['waiting']}" if rollout.get("waiting") else ""  # the budget, or a batch settling
        progress = f" [{len(rollout.get('done', []))} of {len(a['replicas'])} done, {rollout['phase']}{waiting}]"
    outcome = f": {a['outcome']}" if a.get("outcome") else ""
    return f"action {a['id']} {a['kind']} {a['target']} {a['state']}{progress}{outcome}"


# --- commands -----------------------------------------------------------------------------------------------------


def parser(name: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"pitstop {name}", description=description)
    p.add_argument("--url", help="the control plane (default: PITSTOP_URL, the client file, or "
                                      "http://127.0.0.1:8000); the token comes from PITSTOP_TOKEN or the client file")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    return p


def action_parser(name: str, description: str, what: str) -> argparse.ArgumentParser:
    p = parser(name, description)
    p.add_argument("target", metavar=what)
    p.add_argument("--reason", default="", help="why: kept in the action and the audit log")
    p.add_argument("--dry-run", action="store_true", help="only show what the guardrails would decide")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--force", action="store_true", help="bypass a guardrail's refusal (admin token)")
    p.add_argument("--wait", action="store_true", help="follow the action until it finishes")
    return p


def _split(target: str, what: str) -> tuple[str, str]:
    node, sep, rest = target.partition("/")
    if not node or (sep and not rest):
        raise OpsError(Exit.USAGE, f"expected {what}, got {target!r}")
    return node, rest


def _act(client: httpx.Client, io: Io, args: argparse.Namespace, path: str, body: dict[str, Any]) -> int:
    body = {**body, "reason": args.reason, "force": args.force}
    seen = call(client, "POST", path, params={"dry_run": "true"}, body=body)
    held = seen["verdict"] != "allowed" and not seen["forced"]
    if args.json and args.dry_run:
        print(json.dumps(seen, indent=2), file=io.out)
    else:
        print(f"{seen['kind']} {seen['target']}: {seen['summary']}", file=io.out)
    if args.dry_run or held:
        if held and not args.dry_run:
            print("not sent: the guardrails hold it (an admin may pass --force)", file=io.err)
        return Exit.HELD if held else Exit.OK
    if not args.yes:
        if io.ask is None:
            raise OpsError(Exit.USAGE, "no terminal to confirm on: pass --yes (or --dry-run to only look)")
        if io.ask("proceed? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing sent", file=io.err)
            return Exit.OK
    action = call(client, "POST", path, body=body)
    print(json.dumps(action, indent=2) if args.json else action_line(action), file=io.out)
    if action["state"] == "suppressed":  # the fleet changed between the preview and the request
        return Exit.HELD
    if args.wait:
        return _wait(client, io, action)
    return Exit.OK


def _wait(client: httpx.Client, io: Io, action: Mapping[str, Any], every: float = 2.0) -> int:
    last = action_line(action)
    while action["state"] not in FINISHED:
        io.sleep(every)
        action = call(client, "GET", f"/v1/actions/{action['id']}")
        if (line := action_line(action)) != last:
            print(line, file=io.out)
            last = line
    return Exit.FAILED if action["state"] in WENT_WRONG else Exit.OK


def status(client: httpx.Client, io: Io, args: argparse.Namespace) -> int:
    summary = call(client, "GET", "/v1/summary")
    print(json.dumps(summary, indent=2) if args.json else render_status(summary), file=io.out)
    trouble = summary["automation"]["breaker"]["tripped"] or any(m["status"] == "red" for m in summary["models"])
    return Exit.HELD if trouble else Exit.OK


def replicas(client: httpx.Client, io: Io, args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("model", args.model), ("node", args.node), ("state", args.state)) if v}
    found = call(client, "GET", "/v1/replicas", params=params)
    print(json.dumps(found, indent=2) if args.json else table(replica_rows(found), [
        "replica", "model", "state", "gpus", "gen", "ttft p99", "itl p99", "queue", "kv", "rss GiB", "restarts",
        "node"]), file=io.out)
    return Exit.OK


def actions(client: httpx.Client, io: Io, args: argparse.Namespace, polls: int | None = None) -> int:
    params = {"limit": args.limit, **({"state": args.state} if args.state else {})}
    found = call(client, "GET", "/v1/actions", params=params)
    if args.json and not args.follow:
        print(json.dumps(found, indent=2), file=io.out)
        return Exit.OK
    seen: dict[int, str] = {}
    for a in reversed(found):
        seen[a["id"]] = line = action_line(a)
        print(json.dumps(a) if args.json else line, file=io.out)
    while args.follow and (polls is None or polls > 0):
        polls = None if polls is None else polls - 1
        io.sleep(args.every)
        for a in reversed(call(client, "GET", "/v1/actions", params=params)):
            if seen.get(a["id"]) != (line := action_line(a)):
                seen[a["id"]] = line
                print(json.dumps(a) if args.json else line, file=io.out)
    return Exit.OK


def restart(client: httpx.Client, io: Io, args: argparse.Namespace, kind: str = "restart") -> int:
    node, name = _split(args.target, "NODE/REPLICA")
    if not name:
        raise OpsError(Exit.USAGE, f"expected NODE/REPLICA, got {args.target!r}")
    return _act(client, io, args, f"/v1/replicas/{node}/{name}/actions", {"kind": kind})


def drain(client: httpx.Client, io: Io, args: argparse.Namespace) -> int:
    return restart(client, io, args, kind="drain")


def rollout(client: httpx.Client, io: Io, args: argparse.Namespace) -> int:
    """A rolling restart, or with ``--max-num-seqs`` a new value tried on a canary and rolled if it holds up."""
    if args.max_num_seqs is not None:
        body: dict[str, Any] = {"kind": "set_max_num_seqs", "max_num_seqs": args.max_num_seqs}
        if args.canary:
            body["canary"] = args.canary
    else:
        body = {"kind": "rolling_restart", "batch_size": args.batch_size}
    return _act(client, io, args, f"/v1/models/{args.target}/actions", body)


def cordon(client: httpx.Client, io: Io, args: argparse.Namespace, kind: str = "cordon") -> int:
    node, gpu = _split(args.target, "NODE or NODE/GPU")
    if gpu and not gpu.isdigit():
        raise OpsError(Exit.USAGE, f"a GPU is its index: expected NODE/GPU, got {args.target!r}")
    return _act(client, io, args, f"/v1/nodes/{node}/actions", {"kind": kind, "gpu": int(gpu) if gpu else None})


def uncordon(client: httpx.Client, io: Io, args: argparse.Namespace) -> int:
    return cordon(client, io, args, kind="uncordon")
