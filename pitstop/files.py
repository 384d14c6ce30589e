"""``pitstop files [NAME]``: where the files Pitstop ships are installed, to point Prometheus, Alertmanager and
Grafana at them or to copy them.

With a name it prints one directory, for ``cp "$(pitstop files alerts)/pitstop-rules.yml" …``; without, every
one as ``NAME<TAB>DIRECTORY``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pitstop.share import FOLDERS, MissingShareError, folder

WHAT = {
    "dashboards": "Grafana dashboards (pitstop dashboards push) and Grafana's provisioning files",
    "alerts": "Prometheus recording and alerting rules, the Alertmanager configuration",
    "runbooks": "the runbooks the alerts and policies link to",
    "policies": "the default remediation policies the control plane runs",
    "deploy": "systemd units, sample agent.yaml and server.yaml, their env files (deploy/README.md)",
}


def locations() -> dict[str, Path]:
    """Each shipped folder by name."""
    from controlplane.policy_files import DEFAULTS_DIR  # pure file side: no server dependency

    found: dict[str, Path] = {name: folder(name) for name in FOLDERS}
    found["policies"] = DEFAULTS_DIR.resolve()
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pitstop files", description="Print where the files Pitstop ships are installed: one folder by name, "
        "or every one as NAME<TAB>DIRECTORY.",
        epilog="\n".join(f"{name}: {what}" for name, what in WHAT.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", choices=sorted(WHAT), help="one folder (default: all, with names)")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        found = locations()
    except MissingShareError as exc:
        print(f"pitstop files: {exc}", file=sys.stderr)
        return 1
    if args.name:
        print(found[args.name])
        return 0
    for name, path in found.items():
        print(f"{name}\t{path}")
    return 0
