"""The environment Pitstop installs into: no two distributions provide the same top-level module.

A distribution that installs itself under another's module name (urllib3-future is imported as ``urllib3``)
silently replaces that module for everything else in the environment: which one wins depends on the order of
installation, and uninstalling either leaves the other broken. These tests read what each installed distribution
ships (its RECORD; ``top_level.txt`` for an editable install, whose RECORD lists no modules) and what the core,
``agent`` and ``server`` requirements pull in. Only the environment's site-packages count: a build's
``pitstop.egg-info`` in the checkout is not an installed distribution.
"""

from __future__ import annotations

import json
import re
import sys
import sysconfig
import tomllib
from collections import defaultdict
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# Distributions known to install themselves under another distribution's module, with that module.
SHADOWING = {"urllib3-future": "urllib3", "niquests": "requests"}
EXTENSION = re.compile(r"\.(cpython|abi3|pypy)[^/]*\.(so|pyd)$|\.(so|pyd)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> list[metadata.Distribution]:
    """The distributions installed in this environment's site-packages."""
    where = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return list(metadata.distributions(path=where))


def _editable(dist: metadata.Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    return bool(text) and bool(json.loads(text).get("dir_info", {}).get("editable"))


def provided_modules(dist: metadata.Distribution) -> set[str]:
    """The top-level modules and regular packages ``dist`` installs (namespace packages, shared by design, are
    not counted: a package counts by its ``__init__.py``)."""
    found: set[str] = set()
    for file in dist.files or []:
        parts = file.parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
            continue
        if len(parts) == 1 and (file.suffix == ".py" or EXTENSION.search(parts[0])):
            found.add(parts[0].split(".")[0])
        elif len(parts) == 2 and parts[1] == "__init__.py":
            found.add(parts[0])
    if _editable(dist):
        found |= {line.strip() for line in (dist.read_text("top_level.txt") or "").splitlines() if line.strip()}
    return found


def modules_by_provider(dists: Iterable[metadata.Distribution]) -> dict[str, set[str]]:
    providers: dict[str, set[str]] = defaultdict(set)
    for dist in dists:
        for module in provided_modules(dist):
            providers[module].add(canonical(dist.metadata["Name"]))
    return providers


def clashes(dists: Iterable[metadata.Distribution]) -> dict[str, list[str]]:
    return {module: sorted(names) for module, names in sorted(modules_by_provider(dists).items()) if len(names) > 1}


def _project() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {"": project["dependencies"], **project["optional-dependencies"]}


def requirement_closure(requirements: Iterable[str]) -> tuple[dict[str, metadata.Distribution], set[str]]:
    """The installed distributions ``requirements`` pull in (markers evaluated here), and those not installed."""
    by_name = {canonical(d.metadata["Name"]): d for d in installed()}
    found: dict[str, metadata.Distribution] = {}
    missing: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), ("",)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonical(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        dist = by_name.get(name)
        if dist is None:
            missing.add(name)
            continue
        found[name] = dist
        todo += [(Requirement(dep), ("", *req.extras)) for dep in dist.requires or []]
    return found, missing


def test_no_two_installed_distributions_provide_the_same_top_level_module() -> None:
    found = clashes(installed())
    assert found == {}, (f"distributions shadowing each other's modules in {sys.prefix}: {found}; uninstall the "
                         "one that is not wanted and reinstall the other")


def test_each_distribution_is_installed_once() -> None:
    names = [canonical(d.metadata["Name"]) for d in installed()]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize("extra", ["", "agent", "server"])
def test_the_core_and_the_agent_and_server_extras_pull_in_no_shadowing_distribution(extra: str) -> None:
    wanted = _project()[""] + (_project()[extra] if extra else [])
    pulled, missing = requirement_closure(wanted)
    if missing:
        pytest.skip(f"not installed here, so not checked: {sorted(missing)} (pip install -e '.[dev]')")
    assert sorted(set(pulled) & set(SHADOWING)) == []
    assert clashes(pulled.values()) == {}


def test_the_check_sees_a_clash_and_ignores_namespace_packages(tmp_path: Path) -> None:
    def dist(name: str, *files: str) -> metadata.Distribution:
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in (*files, f"{info.name}/RECORD")))
        return metadata.Distribution.at(info)

    real = dist("urllib3", "urllib3/__init__.py", "urllib3/poolmanager.py")
    fake = dist("urllib3-future", "urllib3/__init__.py", "urllib3/contrib/hface.py")
    one = dist("google-auth", "google/auth/__init__.py")
    other = dist("protobuf", "google/protobuf/__init__.py", "_cffi_like.cpython-311-x86_64-linux-gnu.so")
    assert clashes([real, fake, one, other]) == {"urllib3": ["urllib3", "urllib3-future"]}
    assert provided_modules(other) == {"_cffi_like"}
