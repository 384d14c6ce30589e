"""The policy process wakes when a condition under way completes its ``for:``, with no report and no interval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # starts a second interpreter

TTFT = """name: ttft-slo
condition: {signal: ttft_p99_seconds, op: ">", threshold: 0.5, for: 2s}
action: {kind: alert, severity: warning}
"""


def test_a_breach_is_acted_on_when_its_for_completes_though_nothing_else_wakes_the_rounds(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "ttft.yaml").write_text(TTFT)
    # An hour between rounds: only the report's round (which sees the breach begin) and the one it books run.
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'pitstop.db'}", policy_interval_seconds=3600,
                          policy_debounce_seconds=0.05, leader_poll_seconds=0.5, policy_defaults=False,
                          policy_dirs=[str(policies)])
    app = create_app(config, policy_process=True)
    with TestClient(app) as client:
        crossed = datetime.now(UTC)
        slow = replica("r0", ttft=0.9)
        assert client.post("/v1/agents/gpu-a/report", json=body(report(sequence=1, sent_at=crossed, replicas=[slow])),
                           ).status_code == 200

        def alerted() -> list[dict[str, object]]:
            return [a for a in client.get("/v1/actions").json() if a["policy"] == "ttft-slo"]

        wait_until(lambda: bool(alerted()), 20, what="the alert when the for: completes")
        [alert] = alerted()
        assert datetime.fromisoformat(str(alert["created_at"])) >= crossed + timedelta(seconds=2)
