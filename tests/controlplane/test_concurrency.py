"""Many agents reporting at once into one SQLite file: every report lands, none fails on a lock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import httpx

from bench.harness.http import probe
from tests.controlplane.fixtures import body, replica, report

NODES, REPORTS = 8, 6


def test_concurrent_reports_from_many_nodes_all_land(live_api: str) -> None:
    statuses: list[int] = []
    lock = threading.Lock()
    start = datetime.now(UTC)  # the server's clock is the real one: reports are sent now

    def agent(n: int) -> None:
        # Once any token exists, reports need an agent token too.
        with httpx.Client(base_url=live_api, timeout=30, headers={"Authorization": "Bearer agent"}) as client:
            for seq in range(1, REPORTS + 1):
                r = report(f"node-{n}", sequence=seq, sent_at=start + timedelta(seconds=seq),
                           replicas=[replica(f"r{k}") for k in range(4)])
                code = client.post(f"/v1/agents/node-{n}/report", json=body(r)).status_code
                with lock:
                    statuses.append(code)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(NODES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert statuses == [200] * (NODES * REPORTS)
    nodes = probe.get(f"{live_api}/v1/nodes", headers={"Authorization": "Bearer look"}, timeout=10).json()
    assert sorted((n["name"], n["reports_total"], n["replica_count"]) for n in nodes) == [
        (f"node-{n}", REPORTS, 4) for n in range(NODES)]
