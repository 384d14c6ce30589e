"""Parsing policy files: YAML validated by pydantic, each error naming the file, the line and the field.

``yaml.compose`` keeps the node tree with its marks, so a pydantic error location (``("condition", "for")``)
is walked down the tree to the line that holds the bad value. Only text comes in, with its file name for the
errors: reading the files is ``controlplane.policy_files``, outside this package, which does no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import yaml
from pydantic import ValidationError

from controlplane.policy.policy import Policy


@dataclass(frozen=True)
class PolicyError:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{self.file}:{self.line}: {where}{self.message}"


class PolicyLoadError(Exception):
    """One or more policy files are invalid; ``errors`` holds every problem found."""

    def __init__(self, errors: Sequence[PolicyError]) -> None:
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = list(errors)


def _child(node: yaml.Node, key: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == str(key):
                return v
    elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        child: yaml.Node = node.value[key]
        return child
    return None


def _union_tag(node: yaml.Node) -> str | None:
    """The tag pydantic would give this mapping as a condition or action: its detector or kind."""
    if not isinstance(node, yaml.MappingNode):
        return None
    keys = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    for key in ("detector", "kind"):
        value = keys.get(key)
        if isinstance(value, yaml.ScalarNode):
            return str(value.value)
    return "threshold" if "signal" in keys else None


def locate(root: yaml.Node, loc: Sequence[str | int]) -> tuple[int, str]:
    """The 1-based line for a pydantic error location, and the location as a dotted field name.

    Location parts that are not in the document (union tags pydantic inserts, a missing field) are skipped
    for the line, which then points at the nearest enclosing node that exists.
    """
    node, fields = root, []
    for i, part in enumerate(loc):
        if i < len(loc) - 1 and part == _union_tag(node):
            continue  # the tag pydantic adds after a discriminated union, not a key of the document
        found = _child(node, part)
        if found is not None:
            node = found
            fields.append(str(part) if isinstance(part, str) else f"[{part}]")
        elif not isinstance(node, yaml.MappingNode) or isinstance(part, int):
            continue
        elif part == loc[-1]:
            fields.append(str(part))  # a missing or unknown field: name it, point at its parent
    return node.start_mark.line + 1, ".".join(fields).replace(".[", "[")


def _message(error: dict[str, object]) -> str:
    msg = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if error["type"] == "string_type" and isinstance(error.get("input"), bool):
        msg += " (YAML reads yes/no/on/off as booleans: quote the value)"
    if error["type"] == "literal_error" or error["type"] == "enum":
        msg += f" (got {error.get('input')!r})"
    return msg


def parse_policies(text: str, file: str) -> list[Policy]:
    """Policies in one YAML document: a mapping (one policy) or a list of them."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise PolicyLoadError([PolicyError(file, line, "", f"invalid YAML: {exc.problem}")]) from exc
    if root is None:
        raise PolicyLoadError([PolicyError(file, 1, "", "empty file: expected a policy or a list of policies")])
    data = yaml.safe_load(text)
    items = data if isinstance(data, list) else [data]
    item_nodes = root.value if isinstance(root, yaml.SequenceNode) else [root]
    errors: list[PolicyError] = []
    policies: list[Policy] = []
    for item, node in zip(items, item_nodes, strict=True):
        if not isinstance(item, dict):
            errors.append(PolicyError(file, node.start_mark.line + 1, "", "expected a mapping with name, "
                                      "condition and action"))
            continue
        try:
            policies.append(Policy.model_validate(item))
        except ValidationError as exc:
            for err in exc.errors():
                line, field = locate(node, err["loc"])
                errors.append(PolicyError(file, line, field, _message(dict(err))))
    if errors:
        raise PolicyLoadError(errors)
    return policies
