"""On-call end to end in the real app: a wedged replica pages at every receiver format (Alertmanager's
webhook, PagerDuty, Slack, a signed webhook) with what Pitstop did about it; the page is not repeated while
the alert fires; once the replica is back the resolve reaches every receiver; and a breach that returns pages
again at once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from controlplane.notify.signing import verify
from tests.notify.receiving import Receiving
from tests.remediation.fleet import Fleet, SimAgent, SimReplica, fleet

SCHEMAS = Path(__file__).parent / "schemas"
SECRET = "hook-secret-of-test"


@pytest.fixture
def hooks() -> Iterator[dict[str, Receiving]]:
    made = {"am": Receiving(default=200), "pager": Receiving(default=202), "chat": Receiving(default=200),
            "signed": Receiving(default=200)}
    yield made
    for hook in made.values():
        hook.close()


def notifier(hooks: dict[str, Receiving], tmp_path: Path) -> dict[str, Any]:
    key_file = tmp_path / "pd-routing-key"
    key_file.write_text("R0UTINGKEY0123456789abcdef012345\n")
    return {
        "external_url": "https://pitstop.example.internal",
        "runbook_base_url": "https://runbooks.example.internal/pitstop",
        "notifier": {
            "receivers": [
                {"name": "am", "alertmanager_webhook": {"url": hooks["am"].url}},
                {"name": "pager", "pagerduty": {"url": hooks["pager"].url, "routing_key_file": str(key_file)}},
                {"name": "chat", "slack": {"webhook_url": hooks["chat"].url}},
                {"name": "signed", "webhook": {"url": hooks["signed"].url, "hmac_secret": SECRET}},
            ],
            "route": {
                "receiver": "am", "group_by": ["model", "node"], "group_wait": "0s", "group_interval": "10s",
                "repeat_interval": "4h",
                "routes": [{"receiver": name, "continue": True} for name in ("am", "pager", "chat", "signed")],
            },
        },
    }


def schema(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / name).read_text()))


def tick(f: Fleet, seconds: float = 10.0, *, converge: bool = False) -> None:
    f.step(seconds, converge=converge)
    f.jobs.notify()


def test_a_wedged_replica_pages_every_receiver_once_then_resolves_and_a_return_pages_again(
        tmp_path: Path, hooks: dict[str, Receiving]) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent], **notifier(hooks, tmp_path)) as f:
        for _ in range(6):
            tick(f)
        assert all(not h.bodies for h in hooks.values()), "a healthy fleet pages nobody"
        wedged = agent.replica("r0")
        wedged.stalled, wedged.canary_ok, wedged.waiting = True, False, 4
        for _ in range(15):
            tick(f)
        # Paged at every receiver, once, each in its own format, saying what Pitstop did.
        assert [len(h.bodies) for h in hooks.values()] == [1, 1, 1, 1], {k: len(h.bodies) for k, h in hooks.items()}
        am, pd, chat = hooks["am"].bodies[0], hooks["pager"].bodies[0], hooks["chat"].bodies[0]
        schema("alertmanager_webhook_v4.json").validate(am)
        schema("pagerduty_events_v2.json").validate(pd)
        schema("slack_incoming_webhook.json").validate(chat)
        assert am["status"] == "firing" and am["alerts"][0]["labels"]["alertname"] == "pitstop-stall"
        assert "restart of gpu-a/r0" in am["alerts"][0]["annotations"]["pitstop_action"]
        assert am["alerts"][0]["annotations"]["runbook_url"] == "https://runbooks.example.internal/pitstop/runbooks/stall.md"
        assert am["alerts"][0]["generatorURL"].startswith("https://pitstop.example.internal/?action=")
        assert pd["event_action"] == "trigger" and pd["routing_key"] == "R0UTINGKEY0123456789abcdef012345"
        assert "restart of gpu-a/r0" in pd["payload"]["summary"]
        assert "restart of gpu-a/r0" in json.dumps(chat)
        headers, body = hooks["signed"].raw[0]
        verify(SECRET.encode(), headers.get("X-Pitstop-Timestamp"), headers.get("X-Pitstop-Signature"), body,
               datetime.fromtimestamp(int(headers["X-Pitstop-Timestamp"]), UTC))
        # Back to health: the alert resolves once the stall policy is clear for its for: (2 min), and every
        # receiver is told, PagerDuty with a resolve under the same dedup key.
        for _ in range(4):
            tick(f, converge=True)
        wedged.stalled, wedged.canary_ok, wedged.waiting = False, True, 0
        for _ in range(20):
            tick(f, converge=True)
        assert [len(h.bodies) for h in hooks.values()] == [2, 2, 2, 2], {k: len(h.bodies) for k, h in hooks.items()}
        assert hooks["am"].bodies[1]["status"] == "resolved"
        resolve = hooks["pager"].bodies[1]
        assert resolve["event_action"] == "resolve" and resolve["dedup_key"] == pd["dedup_key"]
        [alert] = [a for a in f.client.get("/v1/alerts").json() if a["labels"]["alertname"] == "pitstop-stall"]
        assert alert["state"] == "resolved" and "clear for 120s" in alert["resolved_reason"]
        detail = f.client.get(f"/v1/alerts/{alert['id']}").json()
        assert sorted(d["receiver"] for d in detail["deliveries"]) == sorted(["am", "pager", "chat", "signed"] * 2)
        assert all(d["status"] == "sent" for d in detail["deliveries"])
        # It wedges again: a new alert, paged at once (Alertmanager 0.25 would wait for repeat_interval).
        wedged.stalled, wedged.canary_ok, wedged.waiting = True, False, 4
        for _ in range(15):
            tick(f)
        assert [len(h.bodies) for h in hooks.values()] == [3, 3, 3, 3]
        assert hooks["pager"].bodies[2]["event_action"] == "trigger"
        text = f.client.get("/metrics").text
        assert 'pitstop_cp_notifications_total{outcome="sent",receiver="pager"} 3.0' in text
        assert "pitstop_cp_notifications_pending 0.0" in text
        assert "R0UTINGKEY" not in text and SECRET not in json.dumps(f.client.get("/v1/alerts").json())
