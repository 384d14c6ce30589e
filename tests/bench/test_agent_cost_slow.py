"""``bench/agent_cost.py --quick``: the agent measured beside node_exporter over one window, or alone, saying how
to get node_exporter, when there is none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.agent_cost import find_node_exporter  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.solo]  # it measures the agent's share of a core


def run_quick(out: Path, *extra: str) -> tuple[str, dict[str, Any]]:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_cost.py"), "--quick", "--replicas", "2",
                           "--gpus", "2", "--out", str(out), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.timeout(300)
@pytest.mark.skipif(find_node_exporter(None) is None, reason="needs Debian's prometheus-node-exporter")
def test_the_agent_and_node_exporter_are_read_over_the_same_window(tmp_path: Path) -> None:
    stdout, doc = run_quick(tmp_path / "cost.json", "--prometheus-every", "1")
    (run,) = doc["runs"]
    assert run["cpu_percent"] > 0 and run["node_exporter_cpu_percent"] > 0
    assert run["ratio"] == pytest.approx(run["cpu_percent"] / run["node_exporter_cpu_percent"])
    assert run["node_exporter_series"] > 100  # its default collectors answered the stand-in's scrapes
    assert run["agent_series"] > 0 and run["engine_series"] > 0
    assert doc["settings"]["node_exporter_every"] == 1
    assert "agent / node_exporter" in stdout


@pytest.mark.timeout(300)
def test_without_node_exporter_the_agent_is_measured_alone_and_the_output_says_how_to_get_it(tmp_path: Path) -> None:
    stdout, doc = run_quick(tmp_path / "cost.json", "--node-exporter", str(tmp_path / "no-such-binary"))
    assert "apt-get install -y prometheus-node-exporter" in stdout
    (run,) = doc["runs"]
    assert run["cpu_percent"] > 0 and run["node_exporter_cpu_percent"] is None and run["ratio"] is None
    assert doc["medians"]["ratio"] is None
