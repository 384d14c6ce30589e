"""`pitstop demo` (what `make demo` runs) brings the whole path up and takes all of it down again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import http_ok, wait_until

pytestmark = pytest.mark.slow


def _leftovers(state: str) -> list[psutil.Process]:
    """Processes the demo started (it marks their environment) that are still alive."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PITSTOP_DEMO_STATE") == state:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_demo_serves_three_ready_replicas_with_moving_numbers_then_stops_everything(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = (tmp_path / "demo.out").open("wb")
    demo = subprocess.Popen(
        [sys.executable, "-m", "pitstop.cli", "demo", "--state-dir", str(state), "--duration", "40"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: (state / "demo.json").exists() or demo.poll() is not None, 150, what="demo.json")
        assert demo.poll() is None, (tmp_path / "demo.out").read_text()
        urls = json.loads((state / "demo.json").read_text())
        for key in ("console", "api", "agent_metrics", "agent_token"):
            assert urls[key], key

        assert http_ok(f"{urls['console']}/_stcore/health")
        auth = {"Authorization": f"Bearer {urls['operator_token']}"}
        replicas = httpx.get(f"{urls['api']}/v1/replicas", headers=auth, timeout=3).json()
        assert len(replicas) == 3
        assert all(r["state"] == "READY" for r in replicas), replicas

        def tokens() -> float:
            text = httpx.get(urls["agent_metrics"], timeout=3).text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("pitstop_engine_generation_tokens_per_second{")
            )

        # The load generator keeps the engines busy, so the agent sees tokens flowing.
        wait_until(lambda: tokens() > 0, 30, interval=1, what="generation tokens from the demo's load")
        assert demo.wait(timeout=120) == 0
    finally:
        if demo.poll() is None:
            demo.terminate()
            demo.wait(timeout=60)
        log.close()
    time.sleep(1)
    assert _leftovers(str(state)) == [], "the demo left processes running"
    assert "every process stopped" in (tmp_path / "demo.out").read_text()
