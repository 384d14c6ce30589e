"""The paging path watches itself: the Watchdog always fires at its dead man's switch, and when deliveries
keep failing NotificationsFailing reaches on-call by the second path, then resolves once they flow again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.notify.receiving import Receiving
from tests.remediation.fleet import Fleet, SimAgent, SimReplica, fleet


@pytest.fixture
def hooks() -> Iterator[dict[str, Receiving]]:
    made = {"pager": Receiving(default=500), "heartbeat": Receiving(default=200), "backup": Receiving(default=200)}
    yield made
    for hook in made.values():
        hook.close()


def settings(hooks: dict[str, Receiving]) -> dict[str, Any]:
    return {"external_url": "https://pitstop.example.internal", "notifier": {
        "receivers": [{"name": name, "max_attempts": 2, "alertmanager_webhook": {"url": hook.url}}
                      for name, hook in hooks.items()],
        "route": {"receiver": "pager", "group_interval": "10s"},
        "max_retry_interval": "2s", "watchdog_receiver": "heartbeat", "watchdog_interval": "1m",
        "failing_receiver": "backup", "failing_after": "30s"}}


def names(hook: Receiving) -> list[str]:
    return [a["labels"]["alertname"] + ":" + a["status"] for body in hook.bodies for a in body["alerts"]]


def tick(f: Fleet, seconds: float = 10.0) -> None:
    f.step(seconds)
    f.jobs.notify()


def test_the_watchdog_pings_its_switch_and_a_failing_pager_is_reported_by_the_second_path(
        tmp_path: Path, hooks: dict[str, Receiving]) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent], **settings(hooks)) as f:
        tick(f)
        assert names(hooks["heartbeat"]) == ["Watchdog:firing"]  # at once, and only there
        for _ in range(6):
            tick(f)
        assert names(hooks["heartbeat"]) == ["Watchdog:firing"] * 2  # again after watchdog_interval
        assert hooks["pager"].bodies == [] and hooks["backup"].bodies == []
        wedged = agent.replica("r0")
        wedged.stalled, wedged.canary_ok, wedged.waiting = True, False, 4
        for _ in range(18):
            tick(f)
        # The pager answers 500: its page was tried twice and given up, so the backup path is told.
        assert "pitstop-stall:firing" in names(hooks["pager"])
        assert names(hooks["backup"]) == ["NotificationsFailing:firing"]
        failing = next(a for a in f.client.get("/v1/alerts").json() if a["labels"]["alertname"] ==
                       "NotificationsFailing")
        assert "given up" in failing["annotations"]["summary"]
        # The pager recovers; once nothing failed for failing_after, the backup hears it is over.
        hooks["pager"].default = 200
        for _ in range(8):
            tick(f)
        assert names(hooks["backup"]) == ["NotificationsFailing:firing", "NotificationsFailing:resolved"]
        assert "Watchdog:firing" not in names(hooks["pager"])  # the notifier's own alerts skip the tree
