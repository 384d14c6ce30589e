"""Argument parsing and entry points of the terminal commands (``pitstop.ops``), and ``pitstop silence``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from pitstop import ops
from pitstop.ops import Io, table
from pitstop.opsclient import Exit, OpsError, call, client_for, resolve

Command = Callable[[httpx.Client, Io, argparse.Namespace], int]


def _parsers() -> dict[str, tuple[argparse.ArgumentParser, Command]]:
    p: dict[str, tuple[argparse.ArgumentParser, Command]] = {}
    status = ops.parser("status", "The fleet at a glance: per model SLO status, nodes, alerts, automation, the "
                                   "last actions. Exits 1 when a model is red or the circuit breaker tripped.")
    p["status"] = (status, ops.status)
    replicas = ops.parser("replicas", "Replicas with their latency, queue, KV cache and memory.")
    replicas.add_argument("--model")
    replicas.add_argument("--node")
    replicas.add_argument("--state", help="READY, WARMING, WEDGED, …")
    p["replicas"] = (replicas, ops.replicas)
    actions = ops.parser("actions", "Actions, oldest first; --follow prints each new one and each change.")
    actions.add_argument("--follow", "-f", action="store_true")
    actions.add_argument("--state", help="proposed, approved, running, succeeded, …")
    actions.add_argument("--limit", type=int, default=20)
    actions.add_argument("--every", type=float, default=2.0, help=argparse.SUPPRESS)
    p["actions"] = (actions, ops.actions)
    p["restart"] = (ops.action_parser("restart", "Restart one replica (drained first) through the guardrails.",
                                       "NODE/REPLICA"), ops.restart)
    p["drain"] = (ops.action_parser("drain", "Drain and stop one replica through the guardrails.",
                                     "NODE/REPLICA"), ops.drain)
    rollout = ops.action_parser("rollout", "Rolling restart of every managed replica of a model, within its "
                                            "disruption budget; with --max-num-seqs, that value tried on one "
                                            "replica first and rolled to the others if it holds up.", "MODEL")
    rollout.add_argument("--batch-size", type=int, default=1)
    rollout.add_argument("--max-num-seqs", type=int, help="the new value (a canary first, as the governor does)")
    rollout.add_argument("--canary", metavar="NODE/REPLICA", help="where to try it (default: the first READY)")
    p["rollout"] = (rollout, ops.rollout)
    p["cordon"] = (ops.action_parser("cordon", "Fence a node, or one GPU of it: its replicas drain.",
                                      "NODE[/GPU]"), ops.cordon)
    p["uncordon"] = (ops.action_parser("uncordon", "Give a fenced node or GPU back.", "NODE[/GPU]"), ops.uncordon)
    silence = ops.parser("silence", "Silences: 'add MATCHER… --for 2h --comment WHY', 'list', 'expire ID'.")
    silence.add_argument("verb", choices=["add", "list", "expire"])
    silence.add_argument("args", nargs="*", help='add: matchers such as alertname="pitstop-stall" node="gpu-a"; '
                                                 "expire: the silence's id")
    silence.add_argument("--for", dest="duration", default="2h", help="how long (add; default 2h)")
    silence.add_argument("--comment", default="", help="why (add; required)")
    silence.add_argument("--dry-run", action="store_true", help="add: show the firing alerts it would mute")
    silence.add_argument("--all", action="store_true", help="list: expired ones too")
    p["silence"] = (silence, silence_command)
    return p


def _matches(matchers: Sequence[str], labels: Mapping[str, Any]) -> bool:
    from controlplane.notify.matchers import Matcher

    text = {k: str(v) for k, v in labels.items()}
    return all(Matcher.model_validate(m).matches(text) for m in matchers)


def silence_command(client: httpx.Client, io: Io, args: argparse.Namespace) -> int:
    if args.verb == "list":
        found = call(client, "GET", "/v1/silences", params={} if args.all else {"state": "active"})
        print(json.dumps(found, indent=2) if args.json else table(
            [{**s, "matchers": " ".join(s["matchers"])} for s in found],
            ["id", "state", "matchers", "ends_at", "created_by", "comment"]), file=io.out)
        return Exit.OK
    if args.verb == "expire":
        if len(args.args) != 1 or not args.args[0].isdigit():
            raise OpsError(Exit.USAGE, "expire takes one silence id")
        gone = call(client, "DELETE", f"/v1/silences/{args.args[0]}")
        print(json.dumps(gone, indent=2) if args.json else f"silence {gone['id']} {gone['state']}", file=io.out)
        return Exit.OK
    if not args.args or not args.comment.strip():
        raise OpsError(Exit.USAGE, "add needs matchers and --comment (what on-call reads while it is quiet)")
    if args.dry_run:
        try:
            firing = [a for a in call(client, "GET", "/v1/alerts", params={"state": "firing"})
                      if _matches(args.args, a["labels"])]
        except ValueError as exc:
            raise OpsError(Exit.USAGE, str(exc)) from exc
        print(f"would mute {len(firing)} firing alert(s) for {args.duration}", file=io.out)
        for a in firing:
            print("  " + " ".join(f"{k}={v}" for k, v in sorted(a["labels"].items())), file=io.out)
        return Exit.OK
    made = call(client, "POST", "/v1/silences", body={"matchers": args.args, "duration": args.duration,
                                                      "comment": args.comment})
    print(json.dumps(made, indent=2) if args.json else
          f"silence {made['id']} {made['state']} until {made['ends_at']}: {' '.join(made['matchers'])}", file=io.out)
    return Exit.OK


def run(name: str, argv: Sequence[str], client: httpx.Client | None = None, io: Io | None = None) -> int:
    parser, command = _parsers()[name]
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse printed why
        return int(exc.code or 0) and Exit.USAGE
    if io is None:
        io = Io(ask=input if sys.stdin.isatty() else None)
    try:
        if client is None:
            with client_for(resolve(args.url)) as own:
                return command(own, io, args)
        return command(client, io, args)
    except OpsError as exc:
        print(f"pitstop {name}: {exc}", file=io.err)
        return exc.code
    except KeyboardInterrupt:
        return Exit.OK


def _entry(name: str) -> Callable[[list[str]], int]:
    def main(argv: list[str]) -> int:
        return run(name, argv)
    main.__name__ = f"{name}_main"
    return main


status_main = _entry("status")
replicas_main = _entry("replicas")
actions_main = _entry("actions")
restart_main = _entry("restart")
drain_main = _entry("drain")
rollout_main = _entry("rollout")
cordon_main = _entry("cordon")
uncordon_main = _entry("uncordon")
silence_main = _entry("silence")
