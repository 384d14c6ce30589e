"""The shipped folders are found through the package, and in a checkout they are the top-level folders themselves.

The installed wheel is checked by tests/test_wheel_install_slow.py; these run in the checkout, fast.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from controlplane.policy_cli import main as policy_main
from controlplane.policy_files import DEFAULTS_DIR
from pitstop.files import main as files_main
from pitstop.share import FOLDERS, folder

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", FOLDERS)
def test_each_shipped_folder_is_the_checkouts_top_level_folder(name: str) -> None:
    link = ROOT / "pitstop" / "share" / name
    # Relative, so a copy of the tree (an sdist, a build directory) still finds it.
    assert link.is_symlink() and not Path(link.readlink()).is_absolute()
    assert folder(name) == (ROOT / name).resolve()


def test_the_wheel_is_told_to_carry_every_shipped_folder() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert sorted(data["pitstop.share"]) == sorted(f"{name}/**/*" for name in FOLDERS)


def test_files_prints_each_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert files_main([]) == 0
    listed = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert listed == {**{n: str((ROOT / n).resolve()) for n in FOLDERS}, "policies": str(DEFAULTS_DIR.resolve())}
    assert files_main(["runbooks"]) == 0
    assert capsys.readouterr().out == f"{(ROOT / 'runbooks').resolve()}\n"


def test_policy_check_without_files_checks_the_shipped_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    shipped = len(list(DEFAULTS_DIR.glob("*.yaml")))
    assert policy_main(["check"]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {shipped} policies in {shipped} file(s)")
