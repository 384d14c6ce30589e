"""The console's Alerts section on real API answers: a firing alert first, a muted one saying by what, and
where the chosen one was delivered, failures with the receiver's answer; and the page renders it."""

from __future__ import annotations

from pathlib import Path

from controlplane.console import alerts
from tests.notify.receiving import Receiving
from tests.remediation.fleet import SimAgent, SimReplica, fleet


def test_alert_rows_and_deliveries_come_from_the_api(tmp_path: Path) -> None:
    hook = Receiving(default=400)  # the receiver refuses: the delivery fails, with its answer kept
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    settings = {"external_url": "https://pitstop.example.internal", "notifier": {
        "receivers": [{"name": "pager", "alertmanager_webhook": {"url": hook.url}}], "route": {"receiver": "pager"}}}
    try:
        with fleet(tmp_path, [agent], **settings) as f:
            f.run(30)
            wedged = agent.replica("r0")
            wedged.stalled, wedged.canary_ok, wedged.waiting = True, False, 4
            for _ in range(15):
                f.step(10)
                f.jobs.notify()
            rows = alerts.alert_rows(alerts.fetch_alerts(f.client))
            [stall] = [r for r in rows if r["alert"] == "pitstop-stall"]
            assert stall["state"] == "firing" and stall["target"] == "replica:gpu-a/r0" and stall["muted by"] == ""
            assert rows[0]["state"] == "firing"
            silence = f.client.post("/v1/silences", json={"matchers": ['replica="r0"'], "duration": "1h",
                                                          "comment": "r0 under investigation"}).json()
            [muted] = [r for r in alerts.alert_rows(alerts.fetch_alerts(f.client)) if r["id"] == stall["id"]]
            assert muted["muted by"] == f"silence #{silence['id']}"
            [delivery] = alerts.delivery_rows(alerts.fetch_alert(f.client, int(stall["id"])))
            assert delivery["receiver"] == "pager" and delivery["status"] == "failed" and delivery["answer"] == 400
            assert "HTTP 400: nope" in delivery["error"]
    finally:
        hook.close()
