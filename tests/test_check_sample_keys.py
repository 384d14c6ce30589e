"""``scripts/check_sample_keys.py`` (``make lint``): a replica sample's value read or written by string key fails."""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sample_keys", ROOT / "scripts" / "check_sample_keys.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _script()


def _lines(code: str, *, console: bool = False) -> list[int]:
    return list(check.places(ast.parse(textwrap.dedent(code)), console=console))


def test_reads_and_writes_of_a_signal_by_string_key_are_found() -> None:
    assert _lines("""\
        rate = values["requests_per_second"]
        p99 = v.get("ttft_p99_seconds")
        itl = (row.values or {}).get("itl_p99_seconds", 0.0)
        stored["window"] = {}
        typed = sample.ttft_p99_seconds
        sequence = report["sequence"]
        named = getattr(sample, signal)
        """) == [1, 2, 3, 4]


def test_the_console_is_held_to_reads_of_a_samples_values() -> None:
    # The console reads the API's JSON: a replica's latest readings share the signals' names and are no sample.
    assert _lines("""\
        ttft = engine.get("ttft_p99_seconds")
        generation = replica.get("generation", 0)
        rss = (s.get("values") or {}).get("rss_bytes")
        p99 = s["values"]["ttft_p99_seconds"]
        kv = values.get("kv_cache_usage_ratio")
        """, console=True) == [3, 4, 5]


def test_the_control_plane_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main(["check_sample_keys.py", str(ROOT / "controlplane")]) == 0, capsys.readouterr().out


def test_a_read_fails_the_check_by_its_place_and_migrations_are_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = tmp_path / "controlplane"
    (tree / "store" / "migrations").mkdir(parents=True)
    (tree / "loop.py").write_text('rates = [v["requests_per_second"] for v in rows]\n')
    (tree / "store" / "migrations" / "0012_rename.py").write_text('old = values.pop("requests_per_second")\n')
    assert check.main(["check_sample_keys.py", str(tree)]) == 1
    [hit] = capsys.readouterr().out.splitlines()
    assert hit.startswith(f"{tree / 'loop.py'}:1: ")
