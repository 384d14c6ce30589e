"""A rolling restart survives a fault at every phase of one replica's restart, and nothing is lost.

Three nodes (one agent, one simulated engine each) behind a real HAProxy under steady streaming load; the
control plane runs as a process on PostgreSQL. An operator starts a rolling restart of the model
(``POST /v1/models/<model>/actions``). The middle replica of the rollout is watched through its agent's API,
and the moment it enters the phase one fault is injected:

- ``agent``: kill -9 of its agent, started again at once (as systemd would); the new agent adopts the engine;
- ``control_plane``: kill -9 of ``pitstop server``, started again at once;
- ``engine``: kill -9 of its engine;
- ``database``: every PostgreSQL connection of the control plane cut (``pg_terminate_backend``).

Every case asserts what a user would notice: no request through HAProxy fails (with a killed engine, the
requests it was streaming at that moment are lost with it and counted apart), HAProxy never has fewer than two
replicas UP, the rollout succeeds, exactly one engine runs per replica and GPU with its agent supervising it,
the rollout has one outcome, and its trail (transitions, the audit entry, each replica's restart events, one
new generation each) is there once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.chaos.harness import Fleet, Load, Node
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.slow,
    # One fleet of three nodes under load at a time: the cases run one after another on one worker.
    pytest.mark.xdist_group("chaos"),
    pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                       reason="needs Debian's haproxy"),
]

FAULTS = ("agent", "control_plane", "engine", "database")
PHASES = ("DRAINING", "STOPPING", "STARTING", "WARMING")
FINAL = {"succeeded", "failed", "rolled_back", "expired", "rejected", "suppressed"}


def _engine_port(proc: psutil.Process) -> int | None:
    with contextlib.suppress(psutil.NoSuchProcess, ValueError, IndexError):
        cmd = proc.cmdline()
        return int(cmd[cmd.index("--port") + 1])
    return None


def prepare(fleet: Fleet, fault: str, node: Node) -> Callable[[], None]:
    """The fault, ready to fire: what takes a while to find (the engine's processes) is found beforehand."""
    if fault in ("agent", "control_plane"):
        proc = node.agent if fault == "agent" else fleet.server

        def restart() -> None:
            proc.kill9()
            proc.start()
        return restart
    if fault == "engine":
        engines = [p for p in fleet.engines() if _engine_port(p) == node.engine_port]
        assert engines, f"no engine of {node.key} to kill"

        def kill() -> None:
            for engine in engines:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(engine.pid, signal.SIGKILL)
        return kill
    if fault == "database":
        return lambda: cut_database(fleet)
    raise ValueError(fault)


def cut_database(fleet: Fleet) -> None:
    database = fleet.database_url.rsplit("/", 1)[1]
    admin = fleet.database_url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        cut = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = %s AND pid <> pg_backend_pid()", (database,)).fetchall()
    assert cut, "the control plane held no database connection to cut"


def hit_phase(node: Node, phase: str, timeout: float = 60.0) -> list[str]:
    """Poll the replica through its agent until it is in ``phase``; the states seen on the way."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = node.status()
        state = None if status is None else status["state"]
        if state is not None and (not seen or seen[-1] != state):
            seen.append(state)
        if state == phase:
            return seen
        assert not (status and status["generation"] >= 1 and state == "READY"), \
            f"{node.key} went through its restart without {phase} being seen: {seen}"
        time.sleep(0.01)
    raise AssertionError(f"{node.key} never entered {phase} within {timeout:g}s: {seen}")


def wait_final(fleet: Fleet, action_id: int, timeout: float = 90.0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def final() -> bool:
        nonlocal found
        found = fleet.action(action_id) or found
        return found.get("state") in FINAL

    wait_until(final, timeout, interval=0.2,
               what=f"the rollout to finish (last seen {found.get('state')}: {found.get('params')})\n{fleet.logs()}")
    return found


def events_of(fleet: Fleet, node: Node) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = fleet.get("/v1/events", node=node.name, replica=node.replica, limit="2000")
    return sorted(events, key=lambda e: e["at"])


def restarted(moves: list[tuple[str, str]], *, agent_killed: bool = False) -> bool:
    """The replica's events since the rollout hold its restart in order: out of rotation, stopped, started, READY.

    An agent killed while stopping the engine never saw it stop: the next agent starts from STOPPED."""
    wanted: list[Callable[[tuple[str, str]], bool]] = [lambda m: m == ("READY", "DRAINING")]
    if not agent_killed:
        wanted.append(lambda m: m[1] == "STOPPED")
    wanted += [lambda m: m == ("STOPPED", "STARTING"), lambda m: m == ("WARMING", "READY")]
    for move in moves:
        if wanted and wanted[0](move):
            wanted.pop(0)
    return not wanted


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_rolling_restart_survives_the_fault_with_nothing_lost(fleet: Fleet, fault: str, phase: str) -> None:
    survives(fleet, fault, phase)


# Engines in containers (``runtime: container``): the agent's faults, where adoption by label must find the one
# container and start no second; and the engine's, a container killed under the rollout.
@pytest.mark.parametrize(("fault", "phase"), [("agent", "STARTING"), ("agent", "DRAINING"), ("engine", "WARMING")])
def test_a_rolling_restart_of_containers_survives_the_fault_with_nothing_lost(container_fleet: Fleet, fault: str,
                                                                             phase: str) -> None:
    survives(container_fleet, fault, phase)
    assert container_fleet.podman is not None
    for node in container_fleet.nodes:  # one container per replica, the one its engine runs in
        listed = container_fleet.podman.containers({"io.pitstop.node": node.name})
        assert [c["State"] for c in listed] == ["running"], (node.key, listed)
        assert listed[0]["Labels"]["io.pitstop.generation"] == str((node.status() or {})["generation"])


def survives(fleet: Fleet, fault: str, phase: str) -> None:
    assert fleet.haproxy is not None
    before = {n.key: (n.status() or {})["generation"] for n in fleet.nodes}
    with Load(fleet.haproxy.url, fleet.haproxy) as load:
        wait_until(lambda: len(load.outcomes) >= 5, 20, what="the load to flow")
        began = time.monotonic()
        action = fleet.rolling_restart()
        assert action["state"] == "running", action
        keys = action["replicas"]
        target = next(n for n in fleet.nodes if n.key == keys[1])  # the middle one: a batch before, one after
        seen = hit_phase(target, phase)
        fire = prepare(fleet, fault, target)
        fault_at = time.monotonic()
        fire()
        injected_at = time.monotonic()
        if fault == "control_plane":
            fleet.wait_control_plane()
        done = wait_final(fleet, action["id"])
        ended = time.monotonic()
        time.sleep(1.0)  # requests sent just after the end must be served too
    print(f"{fault} at {phase} (seen {seen}): rollout {done['state']} in {ended - began:.1f}s, "
          f"{len(load.outcomes)} requests", file=sys.stderr)

    # The rollout completed, with one outcome.
    assert done["state"] == "succeeded", (done["outcome"], fleet.logs())

    # No request failed. A killed engine loses what it was streaming when the SIGKILL landed (between the
    # start and the end of the injection, a few milliseconds); nothing else may fail.
    lost_with_engine = [o for o in load.outcomes if fault == "engine" and o.server == target.replica
                        and o.started <= injected_at and o.ended >= fault_at]
    failed = [o for o in load.outcomes if not o.ok and o not in lost_with_engine]
    assert failed == [], f"{len(failed)} of {len(load.outcomes)} requests failed: {failed[:5]}"
    assert sum(1 for o in load.outcomes if o.started > fault_at and o.ok) > 10, "the load stopped after the fault"
    if lost_with_engine:
        print(f"{len(lost_with_engine)} request(s) were streaming on the killed engine", file=sys.stderr)

    # Never fewer than two replicas serving, as HAProxy routes.
    during = [n for at, n in load.up if began <= at <= ended]
    assert during and min(during) >= 2, f"HAProxy counted {min(during)} server(s) UP during the rollout"

    # Exactly one engine per replica and GPU, each the one its (living) agent supervises, at a new generation.
    statuses = {n.key: n.status() for n in fleet.nodes}
    by_port = Counter(_engine_port(p) for p in fleet.engines())
    assert by_port == Counter(n.engine_port for n in fleet.nodes), f"engines by port: {by_port}"
    engine_pids = {p.pid for p in fleet.engines()}
    for node in fleet.nodes:
        status = statuses[node.key]
        assert node.agent.alive() and status is not None, f"{node.key}'s agent is gone"
        assert status["state"] == "READY" and status["generation"] == before[node.key] + 1, status
        assert status["process"] and status["process"]["pid"] in engine_pids, (status["process"], engine_pids)

    # The trail: one action (this rollout), each transition once, one audit entry, each replica restarted once.
    actions = fleet.get("/v1/actions")
    assert [a["id"] for a in actions] == [action["id"]], [(a["id"], a["kind"], a["state"]) for a in actions]
    trail = [(t["from_state"], t["to_state"]) for t in done["transitions"]]
    assert trail == [(None, "approved"), ("approved", "running"), ("running", "succeeded")], trail
    plan = done["params"]["rollout"]
    assert sorted(plan["done"]) == sorted(keys) and len(plan["done"]) == len(keys), plan
    assert [e["what"] for e in fleet.get("/v1/audit")].count("action.rolling_restart") == 1
    rows = {f"{r['node']}/{r['name']}": r for r in fleet.cp_replicas()}
    for node in fleet.nodes:
        assert rows[node.key]["generation"] == before[node.key] + 1, rows[node.key]
        events = events_of(fleet, node)
        marks = [(e["at"], e["kind"], e["from_state"], e["to_state"], e["message"]) for e in events]
        assert len(marks) == len(set(marks)), f"{node.key}: an event stored twice: {Counter(marks).most_common(2)}"
        moves = [(e["from_state"], e["to_state"]) for e in events
                 if e["kind"] == "transition" and e["at"] >= action["created_at"]]
        killed = fault == "agent" and node is target
        assert restarted(moves, agent_killed=killed), f"{node.key}: its restart is not all in its events: {moves}"
