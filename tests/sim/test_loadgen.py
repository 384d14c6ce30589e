"""The load generator against a real simulator process: bounded, and measuring what a client sees."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from enginesim.loadgen import LoadSpec, percentile, prompt_text, run_load, summarize
from tests.sim.conftest import REPO_ROOT, StartSim

pytestmark = pytest.mark.slow


def test_run_load_counts_requests_and_latencies(start_sim: StartSim) -> None:
    sims = [start_sim(), start_sim()]
    spec = LoadSpec(urls=[s.url for s in sims], concurrency=4, duration=20, max_requests=10, prompt_tokens=64,
                    max_tokens=16)
    summary = asyncio.run(run_load(spec))
    assert summary["requests_ok"] == 10 and summary["requests_failed"] == 0
    assert summary["output_tokens"] == 160
    assert 0 < summary["ttft_ms_p50"] <= summary["ttft_ms_p99"]
    assert 0 < summary["itl_ms_p50"] <= summary["itl_ms_p99"]


def test_cli_load_stops_by_itself_and_prints_json(start_sim: StartSim) -> None:
    sim = start_sim("--fault-error-rate", "1")
    out = subprocess.run([sys.executable, "-m", "pitstop.cli", "sim", "load", sim.url, "--concurrency", "2",
                          "--duration", "1", "--model", "test-model"], capture_output=True, text=True,
                         timeout=30, cwd=REPO_ROOT, check=True).stdout
    summary = json.loads(out)
    assert summary["requests_ok"] == 0 and summary["requests_failed"] > 0
    assert set(summary["errors"]) == {"http_500"}


def test_prompt_size_and_percentiles() -> None:
    assert len(prompt_text(3, 100)) == 384  # 96 tokens of text + the chat template's 4
    assert prompt_text(1, 50) != prompt_text(2, 50)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([], 99) is None
    assert summarize([], 1.0)["requests_ok"] == 0
