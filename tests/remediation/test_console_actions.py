"""The console's Actions section: rows and evidence from real API answers, approve from the page."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bench.harness.http import probe
from controlplane.api.app import create_app
from controlplane.console import actions
from tests.console.served import click, open_console
from tests.controlplane.fixtures import T0, FakeClock
from tests.helpers import serve_in_thread
from tests.remediation.fleet import SimAgent, SimReplica, fleet, server_config
from tests.remediation.test_guarded_flows import STALL, policy_dir, wedge


def test_rows_show_state_policy_verdicts_and_the_evidence(tmp_path: Path) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    policies = policy_dir(tmp_path, stall=STALL % ", require_approval: true")
    with fleet(tmp_path, [agent], policy_dirs=[str(policies)]) as f:
        f.run(30)
        wedge(agent, "r0")
        f.run(60)
        view = actions.fetch_actions(f.client)
        [row] = actions.action_rows(view.actions)
        assert row["state"] == "proposed" and row["policy"] == "stall" and row["target"] == "replica:gpu-a/r0"
        assert row["guardrails"].startswith("awaiting_approval by approval")
        lines = actions.evidence_lines(view.actions[0])
        assert lines[0].startswith("stall on gpu-a/r0") and any("canary_ok=False" in x for x in lines)
        assert [p["id"] for p in view.proposed] == [row["id"]]
        assert actions.breaker_line(view.breaker) == (False, "Circuit breaker closed: automation is running.")
        assert actions.decide(f.client, row["id"], approve=True) == f"action {row['id']}: running"
        assert actions.decide(f.client, row["id"], approve=False) == f"action {row['id']} is no longer waiting " \
                                                                      "for approval"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A control plane with a proposal waiting, served by uvicorn in a thread (operator token "op")."""
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    policies = policy_dir(tmp_path, stall=STALL % ", require_approval: true")
    clock = FakeClock(T0 - timedelta(minutes=5))
    with fleet(tmp_path, [agent], clock, policy_dirs=[str(policies)]) as f:
        f.run(30)
        wedge(agent, "r0")
        f.run(60)
    config = server_config(tmp_path, policy_dirs=[str(policies)], operator_tokens=["op"], policies_enabled=False)
    with serve_in_thread(create_app(config, clock=clock)) as url:
        yield url


def test_the_page_lists_a_proposal_and_approves_it(served: str, monkeypatch: pytest.MonkeyPatch) -> None:
    page = open_console(monkeypatch, served, "op", page="views/actions.py")
    assert any(h.value == "Actions" for h in page.subheader)
    assert any("Circuit breaker closed" in c.value for c in page.caption)
    click(page, "Approve")  # asks first
    headers = {"Authorization": "Bearer op"}
    [waiting] = probe.get(f"{served}/v1/actions", params={"policy": "stall"}, headers=headers).json()
    assert waiting["state"] == "proposed"
    click(page, "Confirm: approve")
    [done] = probe.get(f"{served}/v1/actions", params={"policy": "stall"}, headers=headers).json()
    assert done["state"] == "running" and done["approved_by"] == "config:operator-0"
    page.run()  # the running restart's detail shows what it keeps of the old engine
    assert any("Captured before the restart" in m.value for m in page.markdown)
    assert any("gpu-a/r0: waiting for the agent's stack dump" in c.value for c in page.code)


def test_captured_lines_show_the_dump_note_the_stacks_and_the_log_tail() -> None:
    action = {"params": {"captured": {"gpu-a/r0": {
        "stack_dump_note": "captured by py-spy 0.4.3 at 2026-11-29T12:00:00+00:00 from pid 4242 on node gpu-a",
        "stack_dump": 'Thread 4243 (active): "EngineCoreThread"\n    wait_for_step (core.py:412)',
        "log_tail": ["WARNING EngineCore heartbeat late"]}}}}
    lines = actions.captured_lines(action)
    assert lines[0] == "gpu-a/r0: captured by py-spy 0.4.3 at 2026-11-29T12:00:00+00:00 from pid 4242 on node gpu-a"
    assert "    wait_for_step (core.py:412)" in "\n".join(lines)
    assert lines[-1] == "  WARNING EngineCore heartbeat late"
    assert actions.captured_lines({"params": {}}) == []
