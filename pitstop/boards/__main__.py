"""``python -m pitstop.boards``: write dashboards/*.json from the code; ``--check``: fail where they differ."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pitstop.boards import build, dump
from pitstop.boards.inputs import RULES, InputError, load
from pitstop.share import folder

DEFAULT_DIR = folder("dashboards")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pitstop.boards", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a committed dashboard differs from the generated one")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="dashboard directory (default dashboards/)")
    parser.add_argument("--rules", type=Path, default=RULES, help="alert rules the alert panels select by name")
    args = parser.parse_args(argv)
    try:
        boards = build(load(args.rules))
    except (InputError, OSError) as exc:
        print(f"pitstop.boards: error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for name, board in boards.items():
        path = args.dir / name
        shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
        text = dump(board)
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
            print(f"{shown}: {'missing' if current is None else 'differs from what the generator writes'}",
                  file=sys.stderr)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {shown}")
    if stale:
        print("regenerate with: python -m pitstop.boards (the panels read the shipped policies' SLO thresholds and "
              "the alert names of alerts/pitstop-rules.yml: a change there changes them)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
