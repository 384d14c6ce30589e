"""Silences in the real app: create, list, expire (operators, audited), and what they do to paging end to end,
with inhibition beside them: a silenced stall does not page and pages once its silence ends; a cordoned node's
replica alert is not paged but is listed, saying why."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.store.db import current_revision, downgrade, head_revision, make_engine, migrate
from tests.controlplane.fixtures import T0, FakeClock
from tests.notify.receiving import Receiving
from tests.remediation.fleet import Fleet, SimAgent, SimReplica, fleet

VIEWER = {"Authorization": "Bearer v-secret"}
OPERATOR = {"Authorization": "Bearer o-secret"}
ADMIN = {"Authorization": "Bearer a-secret"}
STALL = ['alertname="pitstop-stall"', 'node="gpu-a"']


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(tmp_path: Path, clock: FakeClock) -> Iterator[TestClient]:
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", viewer_tokens=["v-secret"],
                          operator_tokens=["o-secret"], admin_tokens=["a-secret"])
    with TestClient(create_app(config, clock=clock, run_jobs=False)) as c:
        yield c


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/silences", json={"matchers": STALL, "comment": "replacing the NIC", **body},
                           headers=OPERATOR)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


# --- the API -----------------------------------------------------------------------------------------------------


def test_an_operator_creates_a_silence_for_a_duration_as_the_tokens_name(client: TestClient) -> None:
    made = create(client, duration="2h")
    assert made["matchers"] == STALL and made["comment"] == "replacing the NIC"
    assert made["created_by"] == "config:operator-0" and made["state"] == "active"
    assert made["starts_at"] == made["created_at"] == T0.isoformat().replace("+00:00", "Z")
    assert made["ends_at"] == (T0 + timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    assert made["expired_at"] is None and made["expired_by"] is None
    assert client.get(f"/v1/silences/{made['id']}", headers=VIEWER).json() == made
    # The author is the token's, never the client's word.
    spoofed = client.post("/v1/silences", json={"matchers": STALL, "comment": "x", "duration": "1h",
                                                "created_by": "someone-else"}, headers=OPERATOR)
    assert spoofed.status_code == 422 and "created_by" in spoofed.text


def test_a_viewer_reads_silences_but_may_not_create_or_expire_them(client: TestClient) -> None:
    made = create(client, duration="1h")
    assert client.get("/v1/silences", headers=VIEWER).status_code == 200
    assert client.post("/v1/silences", json={"matchers": STALL, "comment": "x", "duration": "1h"},
                       headers=VIEWER).status_code == 403
    assert client.delete(f"/v1/silences/{made['id']}", headers=VIEWER).status_code == 403
    assert client.get("/v1/silences").status_code == 401
    assert client.get(f"/v1/silences/{made['id']}", headers=VIEWER).json()["state"] == "active"


@pytest.mark.parametrize(("body", "says"), [
    ({"matchers": ['alertname="pitstop-stall"', "node~gpu-a"]}, "node~gpu-a"),
    ({"matchers": ['replica=~"r[0"']}, 'replica=~\\"r[0\\"'),
    ({"matchers": ['alertname=~".*"']}, "match every alert"),
    ({"matchers": []}, "matchers"),
    ({"comment": "   "}, "comment"),
    ({"duration": None}, "ends_at or duration"),
    ({"ends_at": "2026-11-29T14:00:00Z"}, "ends_at or duration"),
    ({"duration": "soon"}, "invalid duration"),
    ({"duration": "0s"}, "more than 0s"),
    ({"duration": "400d"}, "at most 366 days"),
    ({"duration": None, "ends_at": "2026-11-29T11:00:00Z"}, "after now"),
    ({"duration": None, "ends_at": "2026-11-29T14:00:00"}, "timezone"),
])
def test_bad_requests_are_refused_saying_what_is_wrong(client: TestClient, body: dict[str, Any], says: str) -> None:
    response = client.post("/v1/silences", json={"matchers": STALL, "comment": "x", "duration": "1h", **body},
                           headers=OPERATOR)
    assert response.status_code == 422, response.text
    assert says in response.text
    assert client.get("/v1/silences", headers=VIEWER).json() == []


def test_listing_newest_first_by_state_and_expiring_keeps_the_row(client: TestClient, clock: FakeClock) -> None:
    first = create(client, duration="1h")
    clock.advance(60)
    later = create(client, starts_at=(T0 + timedelta(hours=3)).isoformat(), duration="1h")
    assert later["state"] == "pending"
    assert [s["id"] for s in client.get("/v1/silences", headers=VIEWER).json()] == [later["id"], first["id"]]
    assert [s["id"] for s in client.get("/v1/silences?state=pending", headers=VIEWER).json()] == [later["id"]]
    assert [s["id"] for s in client.get("/v1/silences?state=active", headers=VIEWER).json()] == [first["id"]]
    assert client.get("/v1/silences?state=gone", headers=VIEWER).status_code == 422

    clock.advance(60)
    expired = client.delete(f"/v1/silences/{first['id']}", headers=OPERATOR)
    assert expired.status_code == 200, expired.text
    out = expired.json()
    assert out["state"] == "expired" and out["expired_by"] == "config:operator-0"
    assert out["ends_at"] == out["expired_at"] == (T0 + timedelta(seconds=120)).isoformat().replace("+00:00", "Z")
    assert client.delete(f"/v1/silences/{first['id']}", headers=OPERATOR).status_code == 409
    assert client.delete("/v1/silences/999", headers=OPERATOR).status_code == 404
    assert client.get("/v1/silences/999", headers=VIEWER).status_code == 404
    # A pending silence expired by hand never starts.
    gone = client.delete(f"/v1/silences/{later['id']}", headers=OPERATOR).json()
    assert gone["state"] == "expired" and gone["starts_at"] == gone["ends_at"]
    assert [s["id"] for s in client.get("/v1/silences?state=expired", headers=VIEWER).json()] == \
        [later["id"], first["id"]]
    assert client.get("/v1/silences?state=active", headers=VIEWER).json() == []
    # Expired rows stay listed for 120 h, then only when asked for.
    clock.advance(121 * 3600)
    assert client.get("/v1/silences", headers=VIEWER).json() == []
    assert len(client.get("/v1/silences?state=expired", headers=VIEWER).json()) == 2

    entries = [e for e in client.get("/v1/audit", headers=ADMIN).json() if e["what"].startswith("silence.")]
    assert [(e["what"], e["target"], e["actor"]) for e in reversed(entries)] == [
        ("silence.create", f"silence:{first['id']}", "config:operator-0"),
        ("silence.create", f"silence:{later['id']}", "config:operator-0"),
        ("silence.expire", f"silence:{first['id']}", "config:operator-0"),
        ("silence.expire", f"silence:{later['id']}", "config:operator-0"),
    ]
    assert entries[-1]["detail"]["matchers"] == STALL and entries[-1]["detail"]["comment"] == "replacing the NIC"
    assert entries[-1]["detail"]["length"] == "1h"
    assert entries[1]["detail"]["was"] == "active"


def test_a_silence_stops_applying_exactly_at_ends_at(client: TestClient, clock: FakeClock) -> None:
    made = create(client, ends_at=(T0 + timedelta(minutes=30)).isoformat())
    clock.advance(30 * 60 - 0.001)
    assert client.get(f"/v1/silences/{made['id']}", headers=VIEWER).json()["state"] == "active"
    clock.advance(0.001)
    out = client.get(f"/v1/silences/{made['id']}", headers=VIEWER).json()
    assert out["state"] == "expired" and out["expired_at"] == out["ends_at"] and out["expired_by"] is None


def test_a_start_in_the_past_starts_now(client: TestClient) -> None:
    made = create(client, starts_at=(T0 - timedelta(days=1)).isoformat(), duration="1h")
    assert made["starts_at"] == T0.isoformat().replace("+00:00", "Z") and made["state"] == "active"


def test_the_migration_adds_the_table_and_goes_back_down(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        migrate(engine, "0008")
        assert "silences" not in inspect(engine).get_table_names()
        migrate(engine)
        assert current_revision(engine) == head_revision()
        assert {c["name"] for c in inspect(engine).get_columns("silences")} >= {
            "id", "matchers", "starts_at", "ends_at", "created_by", "comment", "created_at", "expired_at"}
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO silences (matchers, starts_at, ends_at, created_by, comment, created_at) "
                              "VALUES ('[\"node=\\\"gpu-a\\\"\"]', '2026-11-29 12:00:00', '2026-11-29 14:00:00', "
                              "'ops', 'nic', '2026-11-29 12:00:00')"))
        downgrade(engine, "0008")
        assert current_revision(engine) == "0008"
        assert "silences" not in inspect(engine).get_table_names()
        migrate(engine)
        assert "silences" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


# --- end to end --------------------------------------------------------------------------------------------------


@pytest.fixture
def hook() -> Iterator[Receiving]:
    made = Receiving(default=200)
    yield made
    made.close()


def settings(hook: Receiving) -> dict[str, Any]:
    return {"external_url": "https://pitstop.example.internal", "notifier": {
        "receivers": [{"name": "am", "alertmanager_webhook": {"url": hook.url}}],
        "route": {"receiver": "am", "group_by": ["model", "node"], "group_wait": "0s", "group_interval": "10s",
                  "repeat_interval": "4h"}}}


def tick(f: Fleet, seconds: float = 10.0) -> None:
    f.step(seconds)
    f.jobs.notify()


def stall_alert(f: Fleet) -> dict[str, Any]:
    [alert] = [a for a in f.client.get("/v1/alerts").json() if a["labels"]["alertname"] == "pitstop-stall"]
    return alert


def wedge(agent: SimAgent, name: str = "r0") -> None:
    r = agent.replica(name)
    r.stalled, r.canary_ok, r.waiting = True, False, 4


def test_a_silenced_stall_does_not_page_and_pages_once_its_silence_ends(tmp_path: Path, hook: Receiving) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent], **settings(hook)) as f:
        for _ in range(3):
            tick(f)
        ends = f.clock() + timedelta(minutes=5)
        made = f.client.post("/v1/silences", json={"matchers": STALL, "comment": "known: NIC swap",
                                                   "ends_at": ends.isoformat()})
        assert made.status_code == 201, made.text
        silence = made.json()
        assert silence["created_by"] == "anonymous"  # open mode: no token exists
        wedge(agent)
        while f.clock() + timedelta(seconds=10) < ends:
            tick(f)
        alert = stall_alert(f)
        assert alert["state"] == "firing" and alert["silenced_by"] == [silence["id"]]
        assert alert["inhibited_by"] == []
        assert hook.bodies == [], "a silenced alert pages nobody"
        assert f.client.get(f"/v1/alerts/{alert['id']}").json()["deliveries"] == []
        assert [a["id"] for a in f.client.get("/v1/alerts?silenced=true").json()] == [alert["id"]]
        assert alert["id"] not in [a["id"] for a in f.client.get("/v1/alerts?silenced=false").json()]
        # Exactly at ends_at the silence is over: the still-firing stall pages at once.
        tick(f, (ends - f.clock()).total_seconds())
        assert f.clock() == ends
        assert len(hook.bodies) == 1, hook.bodies
        page = hook.bodies[0]
        assert page["status"] == "firing" and page["alerts"][0]["labels"]["alertname"] == "pitstop-stall"
        assert stall_alert(f)["silenced_by"] == []
        assert f.client.get("/v1/alerts?silenced=true").json() == []
        assert f.client.get(f"/v1/silences/{silence['id']}").json()["state"] == "expired"


def test_a_silence_that_begins_after_the_page_sends_no_resolve_but_the_real_resolve_goes_out(
        tmp_path: Path, hook: Receiving) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])

    def told() -> list[list[tuple[str, str]]]:
        return [[(a["labels"]["replica"], a["status"]) for a in b["alerts"]] for b in hook.bodies]

    with fleet(tmp_path, [agent], **settings(hook)) as f:
        tick(f)
        wedge(agent, "r0")
        for _ in range(15):
            tick(f)
        assert told() == [[("r0", "firing")]]
        made = f.client.post("/v1/silences", json={"matchers": ['alertname="pitstop-stall"', 'replica="r0"'],
                                                   "comment": "looking at r0", "duration": "1h"})
        assert made.status_code == 201
        for _ in range(3):
            tick(f)
        assert told() == [[("r0", "firing")]], "a silence beginning is not a resolve"
        # Its group pages again for r1, without the silenced r0 ...
        wedge(agent, "r1")
        for _ in range(15):
            tick(f)
        assert told() == [[("r0", "firing")], [("r1", "firing")]]
        # ... and still remembers telling r0 fires: when both recover, both resolves go out.
        for _ in range(4):
            f.step(10, converge=True)
            f.jobs.notify()
        for r in agent.replicas:
            r.stalled, r.canary_ok, r.waiting = False, True, 0
        for _ in range(30):
            f.step(10, converge=True)
            f.jobs.notify()
        assert {a["state"] for a in f.client.get("/v1/alerts").json()} == {"resolved"}
        resolved = {replica for body in told()[2:] for replica, status in body if status == "resolved"}
        assert resolved == {"r0", "r1"}, told()


def test_a_cordoned_nodes_replica_alert_is_inhibited_and_listed_saying_why(tmp_path: Path, hook: Receiving) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent], **settings(hook)) as f:
        tick(f)
        cordon = f.client.post("/v1/nodes/gpu-a/actions", json={"kind": "cordon", "reason": "NIC swap"})
        assert cordon.status_code == 201, cordon.text
        wedge(agent)
        for _ in range(15):
            tick(f)
        alert = stall_alert(f)
        assert alert["state"] == "firing"
        assert alert["inhibited_by"] == ["node gpu-a is cordoned"] and alert["silenced_by"] == []
        assert f.client.get(f"/v1/alerts/{alert['id']}").json()["inhibited_by"] == ["node gpu-a is cordoned"]
        assert [a["id"] for a in f.client.get("/v1/alerts?inhibited=true").json()] == [alert["id"]]
        assert hook.bodies == [], "an inhibited alert pages nobody"
        # Uncordoned, the cause is gone: the stall pages.
        assert f.client.post("/v1/nodes/gpu-a/actions", json={"kind": "uncordon"}).status_code == 201
        tick(f)
        assert stall_alert(f)["inhibited_by"] == []
        assert [b["alerts"][0]["labels"]["alertname"] for b in hook.bodies] == ["pitstop-stall"]


def test_a_hardware_xid_pages_and_inhibits_the_replica_alerts_of_its_node(tmp_path: Path, hook: Receiving) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1")])
    with fleet(tmp_path, [agent], **settings(hook)) as f:
        tick(f)
        agent.xid_total, agent.last_xid = 1, 79  # fallen off the bus: cordon the node and page
        wedge(agent)
        for _ in range(15):
            tick(f)
        [xid] = [a for a in f.client.get("/v1/alerts").json() if a["labels"]["alertname"] == "pitstop-xid-hardware"]
        assert xid["state"] == "firing" and xid["inhibited_by"] == [] and xid["silenced_by"] == []
        stall = stall_alert(f)
        assert stall["state"] == "firing" and stall["inhibited_by"] == [xid["id"], "node gpu-a is cordoned"]
        paged = [a["labels"]["alertname"] for b in hook.bodies for a in b["alerts"]]
        assert paged and set(paged) == {"pitstop-xid-hardware"}, paged
