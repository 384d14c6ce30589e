"""Fail when control-plane code reads or writes an action's payload by string key instead of its typed model.

The action contract (docs/design.md, "The action contract") gives every kind a pydantic payload; a dict key
read back from ``params`` (or a rollout plan, a judge, a captured entry) is what it replaced. This finds, in
``controlplane/`` outside the migrations (which transform stored JSON on purpose):

- ``x.params["k"]``, ``params.get("k")`` and the like on names that hold payload parts,
- a ``params=`` keyword or a ``params``/``plan`` assignment given a dict literal with string keys,
- a dict literal that spreads ``**x.params``.

Usage: ``python scripts/check_payload_keys.py [ROOT]``; prints each place and exits 1 when there is any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# Names that held payload parts when payloads were dicts.
PAYLOAD_NAMES = frozenset({"params", "plan", "judge", "given", "captured", "entry", "applied", "extra"})


def _tail(node: ast.expr) -> str | None:
    """The last name in ``a.b.c``, ``c``, or the key of ``x.get("c")``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    if isinstance(node, ast.BoolOp):
        return _tail(node.values[0])
    return None


def _str_key(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _keyed_dict(node: ast.expr) -> bool:
    return isinstance(node, ast.Dict) and any(_str_key(k) for k in node.keys)


def _line(node: ast.AST) -> int | None:
    """The line of ``node`` when it reads or writes a payload by string key, else None."""
    if isinstance(node, ast.Subscript):
        return node.lineno if _str_key(node.slice) and _tail(node.value) in PAYLOAD_NAMES else None
    if isinstance(node, ast.Call):
        keyed = (isinstance(node.func, ast.Attribute) and node.func.attr in {"get", "setdefault", "pop"}
                 and bool(node.args) and _str_key(node.args[0]) and _tail(node.func.value) in PAYLOAD_NAMES)
        return node.lineno if keyed else None
    if isinstance(node, ast.keyword):
        return node.value.lineno if node.arg == "params" and _keyed_dict(node.value) else None
    if isinstance(node, ast.Dict):
        spreads = any(k is None and _tail(v) == "params" for k, v in zip(node.keys, node.values, strict=True))
        return node.lineno if spreads else None
    if isinstance(node, ast.Assign):
        keyed = _keyed_dict(node.value) and any(_tail(t) in {"params", "plan"} for t in node.targets)
        return node.lineno if keyed else None
    return None


def places(tree: ast.AST) -> list[int]:
    """Line numbers of string-key payload reads and writes in one module."""
    return sorted({line for node in ast.walk(tree) if (line := _line(node)) is not None})


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "controlplane")
    hits = [f"{path}:{line}" for path in sorted(root.rglob("*.py")) if "migrations" not in path.parts
            for line in places(ast.parse(path.read_text(), str(path)))]
    for hit in hits:
        print(f"{hit}: an action payload read or written by string key; use its model (policy/payloads.py)")
    print(f"{len(hits)} string-key payload access(es) under {root}", file=sys.stderr)
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
