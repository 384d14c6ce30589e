"""An engine outlives a SIGKILLed agent cleanly: it writes its own log file (no pipe through the agent), so it
keeps logging, a single SIGTERM stops it, and the next agent, which adopts it, reports its last lines from that
file."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.conftest import AgentProcess, ControlPlaneStandIn, group_alive
from tests.agent.test_agent_slow import sim_replica
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

# The simulated engine's own drain (--shutdown-timeout 2 in sim_replica) is the whole of a prompt stop.
PROMPT_STOP_S = 15.0


def _drained(line: str) -> bool:
    """The engine's line on SIGTERM. Its count is whatever was in flight then: an agent's canary may be."""
    return "Draining " in line and " in-flight requests" in line


def _killed_agents_engine(start_agent: Callable[..., AgentProcess], spec: dict[str, object]) -> tuple[int, Path]:
    agent = start_agent([spec])
    pid = agent.wait_state("r1", "READY")["process"]["pid"]
    agent.proc.kill()  # SIGKILL: the agent cannot stop its engine
    agent.proc.wait()
    assert group_alive(pid), "the engine should have outlived a SIGKILLed agent"
    return pid, Path(agent.log).parent / "state" / "logs" / "r1.log"


def test_an_engine_whose_agent_was_killed_keeps_logging_and_stops_on_one_sigterm(
        start_agent: Callable[..., AgentProcess]) -> None:
    pid, log = _killed_agents_engine(start_agent, sim_replica())
    assert "Application startup complete" in log.read_text()
    before = log.stat().st_size
    os.kill(pid, signal.SIGTERM)  # once: an engine writing into a dead agent's pipe ignored this one and the next
    wait_until(lambda: group_alive(pid) == [], PROMPT_STOP_S, what=f"engine {pid} gone after one SIGTERM")
    after = log.read_text()[before:]
    assert any(_drained(line) for line in after.splitlines())  # written with its agent dead, into its own file


def test_a_restarted_agent_adopts_the_engine_and_reports_its_log_tail_from_the_file(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, url = control_plane
    spec = sim_replica()
    engine, _ = _killed_agents_engine(start_agent, spec)
    second = start_agent([spec], control_plane=url)
    assert second.wait_state("r1", "READY")["restarts_total"] == 0
    # Adopted, not restarted: the same pid, once the agent's next pass has sampled it.
    wait_until(lambda: (second.replica("r1").get("process") or {}).get("pid") == engine, 10, what="the adopted pid")
    os.kill(engine, signal.SIGTERM)  # an exit the agent did not ask for: its report carries the engine's last lines

    def reported_tails() -> list[list[str]]:
        return [r.log_tail for report in stand_in.reports for r in report.replicas if r.name == "r1" and r.log_tail]

    # The last lines come from the file: written under the first agent, and after the SIGTERM under the second.
    wait_until(lambda: any(any(_drained(line) for line in tail) for tail in reported_tails()),
               PROMPT_STOP_S, what=f"the adopted engine's last lines in a report\n{second.output()}")
    tail = next(t for t in reported_tails() if any(_drained(line) for line in t))
    assert any("Application startup complete" in line for line in tail)
    assert group_alive(engine) == []
