"""The shipped Alertmanager inhibitions, judged by a real Alertmanager (Debian's): alerts posted to its API with
the labels Prometheus gives them, and the status it reports for each (inhibited by which, or active).

Routes and inhibitions are the shipped ones; only the receivers are replaced by one that goes nowhere, since
inhibition is decided before any receiver is chosen.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness.http import probe
from tests.helpers import wait_until
from tests.observability.conftest import StackProcesses
from tests.observability.rules import ROOT
from tests.observability.stack import ALERTMANAGER, run_alertmanager

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ALERTMANAGER is None, reason="needs Debian's alertmanager")]

SHIPPED = ROOT / "alerts" / "alertmanager.yml"


def _start(tmp: Path, processes: StackProcesses) -> str:
    config = yaml.safe_load(SHIPPED.read_text())
    config["receivers"] = [{"name": r["name"]} for r in config["receivers"]]
    config.pop("templates", None)
    (tmp / "am.yml").write_text(yaml.safe_dump(config))
    return run_alertmanager(tmp, processes, tmp / "am.yml")


def _post(am: str, *alerts: dict[str, str]) -> None:
    now = datetime.now(UTC)
    body = [{"labels": labels, "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}
            for labels in alerts]
    assert probe.post(f"{am}/api/v2/alerts", json=body, timeout=5).status_code == 200


def _status(am: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(alertname, node) -> Alertmanager's status of that alert."""
    alerts = probe.get(f"{am}/api/v2/alerts", timeout=5).json()
    return {(a["labels"]["alertname"], a["labels"].get("node", "")): a["status"] for a in alerts}


def test_a_hardware_xid_mutes_its_nodes_replica_warnings_and_an_application_xid_mutes_nothing(
    tmp_path: Path, stack: StackProcesses
) -> None:
    am = _start(tmp_path, stack)
    replica = {"job": "pitstop-agent", "model": "llama-8b", "replica": "r0", "severity": "warning"}
    _post(am,
          {"alertname": "GPUXidErrors", "node": "gpu-a", "gpu": "0", "xid": "79", "blast_radius": "hardware",
           "severity": "page"},
          {**replica, "alertname": "EngineStalled", "node": "gpu-a"},
          {**replica, "alertname": "ReplicaCrashLoop", "node": "gpu-a", "severity": "page"},
          {"alertname": "GPUXidErrors", "node": "gpu-b", "gpu": "0", "xid": "13", "blast_radius": "application",
           "severity": "warning"},
          {**replica, "alertname": "EngineStalled", "node": "gpu-b"})

    def settled() -> bool:
        return len(_status(am)) == 5

    wait_until(settled, 30, what="the five alerts in Alertmanager")
    status = _status(am)
    # A GPU fell off the bus: the stall on its node is a symptom, muted; a page is never muted by it.
    assert status[("EngineStalled", "gpu-a")]["state"] == "suppressed"
    assert status[("EngineStalled", "gpu-a")]["inhibitedBy"]
    assert status[("ReplicaCrashLoop", "gpu-a")]["state"] == "active"
    # An application XID (the engine's own fault) explains nothing away: the stall is the news.
    assert status[("EngineStalled", "gpu-b")]["state"] == "active"
    assert status[("GPUXidErrors", "gpu-b")]["state"] == "active"
