"""Policy files on disk: where the shipped defaults are, which files a directory holds, and reading them.

The file side of ``controlplane.policy.loader``, kept out of the policy package so that package does no IO.
Parsing and the error locations (file, line, field) stay in the loader; this module reads the text and passes
the path in as the file name.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from controlplane.policy.loader import PolicyError, PolicyLoadError, parse_policies
from controlplane.policy.policy import Policy

# The shipped policies stay inside the policy package, next to the code that parses them, and ship as its package
# data: found the same way from a checkout and from an installed wheel, whatever the current directory.
DEFAULTS_DIR = Path(str(resources.files("controlplane.policy") / "defaults"))


def load_files(paths: Iterable[Path]) -> list[Policy]:
    """Every policy in ``paths``, checking them all before failing; names must be unique across files."""
    errors: list[PolicyError] = []
    policies: list[Policy] = []
    seen: dict[str, str] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            errors.append(PolicyError(str(path), 0, "", f"cannot read: {exc.strerror}"))
            continue
        try:
            loaded = parse_policies(text, str(path))
        except PolicyLoadError as exc:
            errors.extend(exc.errors)
            continue
        for policy in loaded:
            if policy.name in seen:
                line = _name_line(text, policy.name)
                errors.append(PolicyError(str(path), line, "name",
                                          f"duplicate policy name {policy.name!r} (also in {seen[policy.name]})"))
            seen[policy.name] = str(path)
            policies.append(policy)
    if errors:
        raise PolicyLoadError(errors)
    return policies


def _name_line(text: str, name: str) -> int:
    for i, line in enumerate(text.splitlines(), start=1):
        if line.strip().lstrip("- ").startswith("name:") and name in line:
            return i
    return 1


def policy_files(directory: Path) -> list[Path]:
    """The policy files of a directory, sorted, so evaluation order is stable."""
    return sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])


def load_directory(directory: Path = DEFAULTS_DIR) -> list[Policy]:
    """Every policy in a directory (the shipped defaults when none is given)."""
    return load_files(policy_files(directory))
