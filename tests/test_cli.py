"""The `pitstop` command explains itself: the top level and every subcommand answer --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pitstop.cli import COMMANDS, main


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("agent", "server", "console", "sim", "demo"):
        assert name in out


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_has_help(name: str) -> None:
    # A real process: --help must not start servers or need a config file.
    argv = [sys.executable, "-m", "pitstop.cli", name, "--help"]
    if name == "sim":
        argv = [sys.executable, "-m", "pitstop.cli", "sim", "serve", "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"pitstop {name}" in done.stdout
