"""``cp_reports.py --mode failover`` and ``--mode storm``: a leader killed under load, a control plane restarted.

**failover.** Two ``pitstop server`` processes on one database (PostgreSQL: the advisory lock; SQLite: the lock
file beside it), a production-sized history seeded first, and simulated agents (``bench/harness/report_agents.py``)
reporting at ``agents / interval`` per second. Each agent knows both servers' URLs and fails over to the other
after a failed attempt, retrying as the agent does (full jitter, Retry-After): the simplest honest setup, with no
proxy whose own health checks would shape the timing. Once the leader has finished its first policy round (cold:
it reads the whole window, timed as ``leader_cold_first_round_s``, the figure before standbys followed) and the
standby holds nearly as many samples as the leader (``pitstop_cp_policy_history_samples``, within 10 %: each
counts at its own last read), and ``--settle`` seconds more, the leader's process group (API and policy process)
gets SIGKILL, as a host lost. Measured from the standby's /metrics (``pitstop_cp_leader_since_timestamp_seconds``,
``pitstop_cp_policy_round_end_timestamp_seconds``): seconds from the kill to its taking the lock, and to the end
of its first complete policy round, and from the lock to that round. Then every agent's acknowledged reports
are checked against ``nodes.reports_total`` and ``nodes.last_sequence``: a report acknowledged and not stored is
lost, one stored twice is double-counted.

**storm.** One server under the fleet, killed (SIGKILL) and started again after ``--down`` seconds, once per
retry mode: ``fixed`` (the agent before jitter: doubling backoff, Retry-After ignored) and ``jitter`` (today's
``agent.retry.next_attempt_in``). Measured: the peak of attempts per second the server answered after it came
back, and seconds until every agent had a report acknowledged again (from the kill, and from the server's
readiness).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from sqlalchemy import select

from bench.harness.http import probe

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-agent-token"


class Server:
    """One ``pitstop server`` in a process group of its own (so SIGKILL takes its policy process too)."""

    def __init__(self, url: str, port: int, workdir: Path, name: str, env: dict[str, str] | None = None) -> None:
        self.url, self.port, self.workdir, self.name = url, port, workdir, name
        self.env = env or {}
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> float:
        """Start it; the time.time() at which /readyz first answered 200."""
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PITSTOP_SERVER_AGENT_TOKENS": TOKEN,
               "PITSTOP_SERVER_RETENTION_INTERVAL_SECONDS": "3600", **self.env}
        log = (self.workdir / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "server", "--port", str(self.port),
                                      "--database-url", self.url, "--log-level", "warning"], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if probe.get(f"{self.base}/readyz", timeout=1).status_code == 200:
                    return time.time()
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit(f"{self.name} did not start: " + (self.workdir / f"{self.name}.log").read_text()[-2000:])

    def kill(self) -> float:
        """SIGKILL to the whole group; the time.time() it was sent."""
        assert self.proc is not None
        at = time.time()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return at

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextmanager
def servers(*running: Server) -> Iterator[None]:
    try:
        yield
    finally:
        for s in running:
            s.stop()


async def gauges(client: httpx.AsyncClient, base: str) -> dict[str, float]:
    """The server's leadership and policy-round series (empty when it does not answer)."""
    wanted = ("pitstop_cp_leader ", "pitstop_cp_leader_since_timestamp_seconds ",
              "pitstop_cp_policy_round_end_timestamp_seconds ", "pitstop_cp_policy_round_seconds_count ",
              "pitstop_cp_policy_history_samples ", "pitstop_cp_policy_round_seconds_sum ")
    try:
        text = (await client.get(f"{base}/metrics", timeout=10)).text
    except httpx.HTTPError:
        return {}
    return {line.split()[0]: float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted)}


def stored_reports(url: str) -> dict[str, tuple[int, int]]:
    """Per node: (reports_total, last_sequence) as the control planes stored them."""
    from controlplane.store.db import make_engine
    from controlplane.store.models import Node

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {n: (t, s) for n, t, s in conn.execute(select(Node.name, Node.reports_total, Node.last_sequence))}
    finally:
        engine.dispose()


def losses(fleet: object, stored: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Acknowledged reports not stored (lost), stored more than once (double), and sequence gaps; ``before``: what
    the nodes held when this fleet began (its agents count from 1 again, which the control plane takes as a
    restart)."""
    from bench.harness.report_agents import Fleet

    assert isinstance(fleet, Fleet)
    lost = double = broken = 0
    for agent in fleet.agents:
        total, last = stored.get(agent.node, (0, 0))
        total -= before.get(agent.node, (0, 0))[0]
        lost += max(0, agent.acked - total)
        double += max(0, total - agent.acked)
        # Stored k reports whose largest sequence is k: exactly 1..k, none missing.
        broken += int(total != last and agent.acked > 0)
    acked = sum(a.acked for a in fleet.agents)
    return {"reports_acked": acked, "reports_lost": lost, "reports_double": double, "agents_with_gaps": broken}


async def _wait_for(predicate: Callable[[], Awaitable[bool]], limit: float, what: str, every: float = 0.25) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


async def failover(url: str, templates: list[str], workdir: Path, ports: tuple[int, int], *, interval: float,
                   settle: float, after: float, concurrency: int, warm: bool = True) -> dict[str, float | int | str]:
    """One failover; ``warm`` False runs the standby as before it followed (it reads the window on taking over)."""
    from bench.harness.report_agents import Fleet

    env = {"PITSTOP_SERVER_POLICY_WARM_STANDBY": "true" if warm else "false"}
    a, b = (Server(url, p, workdir, n, env) for p, n in zip(ports, ("leader", "standby"), strict=True))
    a.start()  # the first up takes the lock on its first tick
    b.start()
    before = stored_reports(url)
    with servers(a, b):
        fleet = Fleet([a.base, b.base], templates, interval=interval, token=TOKEN, retry="jitter",
                      concurrency=concurrency)
        stop = asyncio.Event()
        load = asyncio.create_task(fleet.run(stop))
        async with httpx.AsyncClient() as client:
            first: dict[str, float] = {}

            async def warmed() -> bool:
                g, h = await gauges(client, a.base), await gauges(client, b.base)
                held = h.get("pitstop_cp_policy_history_samples", 0)
                if not first and g.get("pitstop_cp_policy_round_seconds_count", 0) == 1:
                    first.update(g)  # the leader's first round alone: the cold one
                return (g.get("pitstop_cp_leader") == 1 and g.get("pitstop_cp_policy_round_seconds_count", 0) >= 1
                        and (not warm or held >= 0.9 * g.get("pitstop_cp_policy_history_samples", 0)))

            # The leader's first (cold) round over, and the standby's history as full as the leader's.
            await _wait_for(warmed, 3600, "the leader's first round and the standby's window", every=1.0)
            if (await gauges(client, b.base)).get("pitstop_cp_leader") != 0:
                raise SystemExit("the second server leads too")
            await asyncio.sleep(settle)
            killed = a.kill()
            killed_loop = fleet.loop.time()
            seen: dict[str, float] = {}

            async def took_over() -> bool:
                g = await gauges(client, b.base)
                since = g.get("pitstop_cp_leader_since_timestamp_seconds", 0.0)
                ended = g.get("pitstop_cp_policy_round_end_timestamp_seconds", 0.0)
                seen.update(g)
                return since > 0 and ended > since

            await _wait_for(took_over, 600, "the standby's first policy round")

            async def moved() -> bool:
                return fleet.current_since(killed_loop) is not None

            await _wait_for(moved, 600, "every agent to report after the kill")
            await asyncio.sleep(after)
        stop.set()
        await load
    since = seen["pitstop_cp_leader_since_timestamp_seconds"]
    ended = seen["pitstop_cp_policy_round_end_timestamp_seconds"]
    current = fleet.current_since(killed_loop)
    return {"standby": "warm" if warm else "cold",
            "leader_cold_first_round_s": round(first.get("pitstop_cp_policy_round_seconds_sum", -1.0), 2),
            "kill_to_lock_s": round(since - killed, 2),
            "kill_to_first_round_s": round(ended - killed, 2),
            "lock_to_first_round_s": round(ended - since, 2),
            "agents_current_after_kill_s": round(current - killed_loop, 2) if current is not None else -1,
            **losses(fleet, stored_reports(url), before)}


async def storm(url: str, templates: list[str], workdir: Path, port: int, *, interval: float, settle: float,
                down: float, retry: str, concurrency: int) -> dict[str, float | int | str]:
    from bench.harness.report_agents import Fleet

    s = Server(url, port, workdir, f"storm-{retry}")
    s.start()
    with servers(s):
        fleet = Fleet([s.base], templates, interval=interval, token=TOKEN, retry=retry, concurrency=concurrency)
        stop = asyncio.Event()
        load = asyncio.create_task(fleet.run(stop))
        await asyncio.sleep(settle)
        steady = fleet.peak(fleet.seen.answered, fleet.loop.time() - settle / 2, fleet.loop.time())
        killed_wall, killed = s.kill(), fleet.loop.time()
        await asyncio.sleep(down)
        ready_wall = await asyncio.to_thread(s.start)
        ready = killed + (ready_wall - killed_wall)

        async def current() -> bool:
            return fleet.current_since(killed) is not None

        await _wait_for(current, 600, "every agent to report again", every=0.5)
        done = fleet.current_since(killed)
        assert done is not None
        await asyncio.sleep(interval)
        stop.set()
        await load
    return {"retry": retry, "steady_peak_per_s": steady,
            "peak_per_s_after_restart": fleet.peak(fleet.seen.answered, ready, fleet.loop.time()),
            "failed_attempts": sum(n for t, n in fleet.seen.failed.items() if t >= killed),
            "restart_to_ready_s": round(ready - killed, 2), "kill_to_all_current_s": round(done - killed, 2),
            "ready_to_all_current_s": round(done - ready, 2)}
