"""Fail when control-plane code reads or writes a replica sample's value by string key, not through the table.

The table of replica signals (``controlplane/policy/signals.py``; docs/design.md, "Replica signals") declares what
a sample holds; code reads a ``ReplicaSample``'s attributes (``from_stored`` makes one of stored values) and
stores what ``stored_values`` gives. This finds, in ``controlplane/`` outside the table's module and the
migrations (which transform stored JSON on purpose), every ``x["k"]`` (read or written) and ``x.get("k")``
(``pop``, ``setdefault``) whose key ``k`` is a signal's name.

The console is a client of the HTTP API: it reads the API's JSON, where a replica's latest readings (``engine``,
``process``, its canary and generation) share the signals' names. There, only a read from a sample's ``values``
counts: ``values.get("k")``, ``s["values"]["k"]``, ``(s.get("values") or {}).get("k")``.

Usage: ``python scripts/check_sample_keys.py [ROOT]``; prints each place and exits 1 when there is any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection
from pathlib import Path

from controlplane.policy import signals as table
from controlplane.policy.signals import SIGNALS

TABLE = Path(table.__file__).resolve()  # the one module that reads stored values by name
CONSOLE = "console"
READS = frozenset({"get", "pop", "setdefault"})


def _key(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _read(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(receiver, key) of ``x["key"]`` or ``x.get("key", ...)``; None for anything else."""
    if isinstance(node, ast.Subscript) and (key := _key(node.slice)) is not None:
        return node.value, key
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READS
            and node.args and (key := _key(node.args[0])) is not None):
        return node.func.value, key
    return None


def _sample_values(node: ast.expr) -> bool:
    """Whether ``node`` is a sample's values: ``values``, ``x.values``, ``x["values"]``, ``x.get("values")``, or one
    of them ``or`` a default."""
    if isinstance(node, ast.BoolOp):
        return _sample_values(node.values[0])
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) == "values"
    read = _read(node)
    return read is not None and read[1] == "values"


def places(tree: ast.AST, *, signals: Collection[str] = SIGNALS, console: bool = False) -> list[int]:
    """Line numbers of string-key reads and writes of a signal in one module (``console``: of a sample's values
    only)."""
    lines = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript | ast.Call) or (read := _read(node)) is None:
            continue
        if read[1] in signals and (not console or _sample_values(read[0])):
            lines.add(node.lineno)
    return sorted(lines)


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "controlplane")
    hits = [f"{path}:{line}" for path in sorted(root.rglob("*.py"))
            if "migrations" not in path.parts and path.resolve() != TABLE
            for line in places(ast.parse(path.read_text(), str(path)), console=CONSOLE in path.parts)]
    for hit in hits:
        print(f"{hit}: a replica sample's value read or written by string key; use the table (policy/signals.py)")
    print(f"{len(hits)} string-key sample access(es) under {root}", file=sys.stderr)
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
