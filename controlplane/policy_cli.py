"""``pitstop policy``: check policy files; explain what the policies would do for a fleet snapshot.

Arguments, files and HTTP live here, outside ``controlplane.policy``, which only decides.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from controlplane.policy.engine_fit import engine_notes
from controlplane.policy.explain import explain, render_text
from controlplane.policy.guardrails import GuardConfig, GuardState
from controlplane.policy.loader import PolicyLoadError
from controlplane.policy.snapshot import FleetSnapshot
from controlplane.policy_files import DEFAULTS_DIR, load_files, policy_files

M = TypeVar("M", FleetSnapshot, GuardState, GuardConfig)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitstop policy", description="Remediation policies: check and explain.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate policy files (errors as FILE:LINE: field: message)")
    check.add_argument("files", nargs="*", type=Path, default=[DEFAULTS_DIR],
                       help="policy YAML files or directories of them (default: the shipped defaults)")
    exp = sub.add_parser("explain", help="what each policy would do now (on the live fleet, or for a snapshot), "
                         "with guardrail decisions")
    exp.add_argument("--snapshot", type=Path,
                     help="fleet snapshot JSON (FleetSnapshot); without it, ask the control plane about the live fleet")
    exp.add_argument("--api-url", default=os.environ.get("PITSTOP_API_URL", "http://127.0.0.1:8000"),
                     help="control plane for the live fleet (env PITSTOP_API_URL; default http://127.0.0.1:8000)")
    exp.add_argument("--token", default=os.environ.get("PITSTOP_TOKEN"),
                     help="API token with at least the viewer role (env PITSTOP_TOKEN)")
    exp.add_argument("--policies", type=Path, default=DEFAULTS_DIR,
                     help="policy file or directory (default: the shipped defaults)")
    exp.add_argument("--guard-state", type=Path, help="guard state JSON: recent actions and the breaker")
    exp.add_argument("--guardrails", type=Path, help="fleet-wide guardrail settings (YAML)")
    exp.add_argument("--now", type=_aware,
                     help="evaluate at this ISO time, UTC unless it says (default: the snapshot's now)")
    exp.add_argument("--json", action="store_true", help="print the report as JSON")
    exp.add_argument("--no-evidence", action="store_true", help="omit evidence lines from the text report")
    return parser


def _aware(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _expand(paths: Sequence[Path]) -> list[Path]:
    return [f for p in paths for f in (policy_files(p) if p.is_dir() else [p])]


def _check(files: Sequence[Path]) -> int:
    expanded = _expand(files)
    if not expanded:
        print("pitstop policy: no policy files found", file=sys.stderr)
        return 1
    try:
        policies = load_files(expanded)
    except PolicyLoadError as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 1
    for path in expanded:
        for policy in load_files([path]):
            for note in engine_notes(policy):
                print(f"note: {path}: policy {policy.name}: {note}")
    print(f"ok: {len(policies)} policies in {len(expanded)} file(s)")
    return 0


def _read_model(path: Path, model: type[M]) -> M:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        return model.model_validate(yaml.safe_load(text) or {})
    return model.model_validate_json(text)


def _explain_live(args: argparse.Namespace, client: Any) -> int:
    from controlplane.remediation.live import LiveError, fetch_explain  # HTTP only for the live fleet

    try:
        report = fetch_explain(args.api_url, args.token, client=client)
    except LiveError as exc:
        print(f"pitstop policy: {exc}", file=sys.stderr)
        return 1
    print(report.model_dump_json(indent=2) if args.json else render_text(report, evidence=not args.no_evidence))
    return 0


def _explain(args: argparse.Namespace, client: Any = None) -> int:
    if args.snapshot is None:
        return _explain_live(args, client)
    try:
        policies = load_files(_expand([args.policies]))
    except PolicyLoadError as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 1
    try:
        snapshot = _read_model(args.snapshot, FleetSnapshot)
        state = _read_model(args.guard_state, GuardState) if args.guard_state else GuardState()
        config = _read_model(args.guardrails, GuardConfig) if args.guardrails else GuardConfig()
    except (OSError, ValidationError, yaml.YAMLError) as exc:
        print(f"pitstop policy: {exc}", file=sys.stderr)
        return 1
    report = explain(policies, snapshot, state, args.now or snapshot.now, config)
    print(report.model_dump_json(indent=2) if args.json else render_text(report, evidence=not args.no_evidence))
    return 0


def main(argv: Sequence[str] | None = None, *, client: Any = None) -> int:
    """``client``: an ``httpx.Client`` for the live explain (tests pass the app's own)."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "check":
        return _check(args.files)
    return _explain(args, client)


if __name__ == "__main__":
    raise SystemExit(main())
