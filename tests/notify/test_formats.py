"""Each receiver's format against a JSON Schema written from that tool's public documentation, and at the tool's
limits: 200 alerts (Slack's 50 blocks, PagerDuty's 512 KB), a 5,000-character summary (PagerDuty's 1,024,
Slack's 150 and 3,000), unicode, a missing runbook, a resolved group."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from controlplane.notify import formats
from controlplane.notify.formats.common import clip, units
from controlplane.notify.model import AlertView, Notification, Request
from controlplane.notify.signing import verify

SCHEMAS = Path(__file__).parent / "schemas"
T0 = datetime(2026, 12, 1, 3, 12, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)
CONSOLE = "https://pitstop.example.com"
ROUTING_KEY = "R0UT1NGKEY0123456789abcdef012345"
SECRET = b"webhook-secret"
SLACK_URL = "https://hooks.slack.com/services/T000/B000/XXXX"


def alert(i: int = 0, *, status: str = "firing", severity: str = "warning", summary: str = "replica stalled",
          action: str = "restarted replica gpu-a/r2 at 03:12 after a stall; READY again at 03:13",
          runbook: str | None = "https://runbooks.example.com/stall", evidence: dict[str, object] | None = None,
          name: str = "PitstopStall", ends_at: datetime | None = None, **labels: str) -> AlertView:
    annotations = {"summary": summary}
    if runbook is not None:
        annotations["runbook_url"] = runbook
    return AlertView(
        fingerprint=f"{i:032x}", status=status,  # type: ignore[arg-type]
        labels={"alertname": name, "severity": severity, "model": "tiny-llama", "node": "gpu-a",
                "replica": f"gpu-a/r{i}", **labels},
        annotations=annotations, starts_at=T0 + timedelta(seconds=i), severity=severity,  # type: ignore[arg-type]
        ends_at=ends_at if ends_at is not None or status == "firing" else T0 + timedelta(minutes=3),
        generator_url=f"{CONSOLE}/actions/{100 + i}", action_summary=action,
        evidence=evidence if evidence is not None else {"stalled_seconds": 61.5, "last_tokens_per_s": 0.0},
    )


def group(*alerts: AlertView, truncated: int = 0) -> Notification:
    return Notification(receiver="oncall", group_key='{}:{alertname="PitstopStall",model="tiny-llama"}',
                        group_labels={"alertname": "PitstopStall", "model": "tiny-llama"}, alerts=list(alerts),
                        external_url=CONSOLE, truncated_alerts=truncated)


ONE = group(alert(0, severity="page"))
SEVERAL = group(alert(0, severity="warning"), alert(1, severity="page", name="PitstopXid", node="gpu-b"),
                alert(2, status="resolved"), alert(3, severity="info", action=""))
RESOLVED = group(alert(0, status="resolved"), alert(1, status="resolved", severity="page"))


@cache
def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def conforms(name: str, doc: Any) -> None:
    errors = sorted(validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message[:300]}" for e in errors[:5])


def decode(req: Request) -> Any:
    def no_nan(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")
    return json.loads(req.body.decode("utf-8"), parse_constant=no_nan)


def am(n: Notification, **kw: Any) -> dict[str, Any]:
    req = formats.alertmanager_webhook(n, url="https://bridge.example.com/alerts", now=NOW, **kw)
    doc = decode(req)
    conforms("alertmanager_webhook_v4.json", doc)
    return doc


def pd(n: Notification, **kw: Any) -> tuple[Request, dict[str, Any]]:
    req = formats.pagerduty(n, routing_key=ROUTING_KEY, now=NOW, **kw)
    doc = decode(req)
    conforms("pagerduty_events_v2.json", doc)
    assert len(req.body) <= 512_000
    return req, doc


def sl(n: Notification) -> dict[str, Any]:
    req = formats.slack(n, url=SLACK_URL, now=NOW)
    doc = decode(req)
    conforms("slack_incoming_webhook.json", doc)
    for block in doc["blocks"]:  # Slack counts UTF-16 units: never fewer than the schema's characters
        texts = [block["text"]] if "text" in block else block.get("elements", [])
        limit = 150 if block["type"] == "header" else 3000
        assert all(units(t["text"]) <= limit for t in texts)
    return doc


def wh(n: Notification) -> tuple[Request, dict[str, Any]]:
    req = formats.webhook(n, url="https://receiver.example.com/hook", secret=SECRET, now=NOW)
    doc = decode(req)
    conforms("pitstop_webhook_v1.json", doc)
    verify(SECRET, req.headers["X-Pitstop-Timestamp"], req.headers["X-Pitstop-Signature"], req.body, NOW)
    return req, doc


ALL = pytest.mark.parametrize("n", [ONE, SEVERAL, RESOLVED, group()], ids=["one", "several", "resolved", "empty"])


# -- every format --------------------------------------------------------------------------------------------


@ALL
def test_every_format_conforms(n):
    am(n)
    pd(n)
    sl(n)
    wh(n)


@ALL
@pytest.mark.parametrize("kind", ["alertmanager_webhook", "pagerduty", "slack", "webhook"])
def test_bodies_are_compact_utf8_json(n, kind):
    settings: dict[str, Any] = {"url": "https://x.example.com"}
    if kind == "pagerduty":
        settings = {"routing_key": ROUTING_KEY}
    if kind == "webhook":
        settings["secret"] = SECRET
    req = formats.render(kind, n, now=NOW, **settings)
    assert req.body == json.dumps(decode(req), separators=(",", ":"), ensure_ascii=False).encode()
    assert req.headers["Content-Type"] == "application/json"


def test_render_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown receiver kind"):
        formats.render("email", ONE, now=NOW, url="x")  # type: ignore[arg-type]


def test_secrets_stay_where_the_tool_wants_them():
    req, _ = pd(ONE)
    assert ROUTING_KEY not in req.url and ROUTING_KEY not in json.dumps(dict(req.headers))
    req, _ = wh(ONE)
    assert SECRET.decode() not in req.body.decode() and SECRET.decode() not in json.dumps(dict(req.headers))
    assert SECRET.decode() not in req.url


def test_unicode_goes_out_as_utf8_not_escapes():
    n = group(alert(0, name="KV-Cache-Überlauf", summary="モデルが停止しました 🔥", action="redémarré ✅"))
    for req in (formats.alertmanager_webhook(n, url="u", now=NOW), formats.pagerduty(n, routing_key="k", now=NOW),
                formats.slack(n, url="u", now=NOW), formats.webhook(n, url="u", secret=SECRET, now=NOW)):
        text = req.body.decode("utf-8")
        assert "モデルが停止しました 🔥" in text and "\\u" not in text
    am(n)
    pd(n)
    sl(n)
    wh(n)


def test_evidence_that_json_cannot_hold_is_made_plain():
    n = group(alert(0, evidence={"rate": float("nan"), "peak": float("inf"), "at": T0, "gpus": (0, 1),
                                 "seen": {"r1"}, "raw": b"\xff", "obj": object.__new__(object)}))
    _, doc = wh(n)
    assert doc["alerts"][0]["evidence"]["rate"] == "nan"
    assert doc["alerts"][0]["evidence"]["at"] == "2026-12-01T03:12:00Z"
    assert doc["alerts"][0]["evidence"]["gpus"] == [0, 1]
    pd(n)


def test_a_lone_surrogate_does_not_fail_the_delivery():
    n = group(alert(0, summary="bad \ud800 text"))
    for req in (formats.alertmanager_webhook(n, url="u", now=NOW), formats.slack(n, url="u", now=NOW)):
        req.body.decode("utf-8")


# -- Alertmanager webhook -------------------------------------------------------------------------------------


def test_alertmanager_firing_one():
    doc = am(ONE)
    assert doc["version"] == "4" and doc["status"] == "firing" and doc["receiver"] == "oncall"
    assert doc["groupKey"] == ONE.group_key and doc["truncatedAlerts"] == 0 and doc["externalURL"] == CONSOLE
    (a,) = doc["alerts"]
    assert a["endsAt"] == "0001-01-01T00:00:00Z" and a["startsAt"] == "2026-12-01T03:12:00Z"
    assert a["annotations"]["pitstop_action"].startswith("restarted replica gpu-a/r2")
    assert a["annotations"]["runbook_url"] == "https://runbooks.example.com/stall"
    assert a["generatorURL"] == f"{CONSOLE}/actions/100" and a["fingerprint"] == "0" * 32
    assert a["labels"]["alertname"] == "PitstopStall"
    assert doc["commonLabels"]["severity"] == "page"


def test_alertmanager_several_share_only_common_labels():
    doc = am(SEVERAL)
    assert doc["status"] == "firing"
    assert [a["status"] for a in doc["alerts"]] == ["firing", "firing", "resolved", "firing"]
    assert doc["commonLabels"] == {"model": "tiny-llama"}
    assert doc["commonAnnotations"] == {"summary": "replica stalled", "runbook_url": "https://runbooks.example.com/stall"}
    assert "pitstop_action" not in doc["alerts"][3]["annotations"]  # it did nothing: no annotation
    assert doc["alerts"][2]["endsAt"] == "2026-12-01T03:15:00Z"


def test_alertmanager_resolved():
    n = group(alert(0, status="resolved"), replace(alert(1, status="resolved"), ends_at=None))
    doc = am(n)
    assert doc["status"] == "resolved"
    assert doc["alerts"][0]["endsAt"] == "2026-12-01T03:15:00Z"
    assert doc["alerts"][1]["endsAt"] == "2026-12-01T03:17:00Z"  # no end recorded: now


def test_alertmanager_max_alerts_counts_the_rest():
    n = group(*[alert(i) for i in range(200)], truncated=5)
    assert len(am(n)["alerts"]) == 200
    doc = am(n, max_alerts=20)
    assert len(doc["alerts"]) == 20 and doc["truncatedAlerts"] == 185


def test_alertmanager_values_are_strings():
    n = group(AlertView(fingerprint="f", status="firing", labels={"alertname": "A"},
                        annotations={"action_id": 7, "evidence": ["a", 1]},  # type: ignore[dict-item]
                        starts_at=T0.replace(tzinfo=None, microsecond=250_000)))
    doc = am(n)
    assert doc["alerts"][0]["annotations"] == {"action_id": "7", "evidence": '["a", 1]'}
    assert doc["alerts"][0]["startsAt"] == "2026-12-01T03:12:00.250000Z"


def test_alertmanager_missing_runbook():
    doc = am(group(alert(0, runbook=None)))
    assert "runbook_url" not in doc["alerts"][0]["annotations"]


# -- PagerDuty ------------------------------------------------------------------------------------------------


def test_pagerduty_trigger_one():
    req, doc = pd(ONE)
    assert req.url == "https://events.pagerduty.com/v2/enqueue" and req.ok == frozenset({202})
    assert doc["routing_key"] == ROUTING_KEY and doc["event_action"] == "trigger"
    assert doc["dedup_key"] == hashlib.sha256(ONE.group_key.encode()).hexdigest()
    p = doc["payload"]
    assert p["severity"] == "critical" and p["source"] == "gpu-a" and p["component"] == "tiny-llama"
    assert p["group"] == "gpu-a" and p["class"] == "PitstopStall" and p["timestamp"] == "2026-12-01T03:12:00Z"
    assert p["summary"] == ("PitstopStall: replica stalled — Pitstop: restarted replica gpu-a/r2 at 03:12 after a "
                            "stall; READY again at 03:13")
    assert doc["links"] == [{"href": f"{CONSOLE}/actions/100", "text": "Pitstop console"},
                            {"href": "https://runbooks.example.com/stall", "text": "Runbook"}]
    assert doc["client"] == "Pitstop" and doc["client_url"] == CONSOLE
    details = p["custom_details"]
    assert details["group"]["firing"] == 1 and "truncated" not in details
    assert details["alert 1 PitstopStall"]["pitstop_action"].startswith("restarted")
    assert details["alert 1 PitstopStall"]["labels"]["replica"] == "gpu-a/r0"
    assert details["alert 1 PitstopStall evidence"] == {"stalled_seconds": 61.5, "last_tokens_per_s": 0.0}


def test_pagerduty_dedup_key_is_stable_for_the_group():
    _, first = pd(ONE)
    _, again = pd(SEVERAL)
    _, resolved = pd(RESOLVED)
    assert first["dedup_key"] == again["dedup_key"] == resolved["dedup_key"]
    _, other = pd(replace(ONE, group_key="{}:{alertname=\"Other\"}"))
    assert other["dedup_key"] != first["dedup_key"]
    _, long = pd(replace(ONE, group_key="x" * 5000))
    assert len(long["dedup_key"]) <= 255


def test_pagerduty_several_leads_with_the_worst():
    _, doc = pd(SEVERAL)
    p = doc["payload"]
    assert p["summary"].startswith("[3 firing] PitstopXid: replica stalled — Pitstop: restarted")
    assert p["severity"] == "critical" and p["source"] == "gpu-b" and p["class"] == "PitstopXid"
    assert list(p["custom_details"])[1:3] == ["alert 1 PitstopXid", "alert 1 PitstopXid evidence"]
    assert p["custom_details"]["alert 4 PitstopStall"]["status"] == "resolved"


@pytest.mark.parametrize(("severity", "expected"), [("page", "critical"), ("warning", "warning"), ("info", "info")])
def test_pagerduty_severity(severity, expected):
    _, doc = pd(group(alert(0, severity=severity)))
    assert doc["payload"]["severity"] == expected


def test_pagerduty_says_when_pitstop_did_nothing():
    _, doc = pd(group(alert(0, action="")))
    assert doc["payload"]["summary"] == "PitstopStall: replica stalled — Pitstop took no action"


def test_pagerduty_source_falls_back():
    a = AlertView(fingerprint="f", status="firing", labels={"alertname": "A"}, annotations={}, starts_at=T0)
    _, doc = pd(group(a))
    assert doc["payload"]["source"] == "pitstop"
    assert "component" not in doc["payload"] and "group" not in doc["payload"]
    a = replace(a, labels={"alertname": "A", "model": "m"})
    assert pd(group(a))[1]["payload"]["source"] == "m"


def test_pagerduty_resolve_carries_only_the_key():
    req, doc = pd(RESOLVED)
    assert doc == {"routing_key": ROUTING_KEY, "event_action": "resolve",
                   "dedup_key": hashlib.sha256(RESOLVED.group_key.encode()).hexdigest()}
    assert req.ok == frozenset({202})


def test_pagerduty_resolves_only_when_the_whole_group_has():
    _, doc = pd(group(alert(0, status="resolved"), alert(1)))
    assert doc["event_action"] == "trigger"


def test_pagerduty_url_may_be_overridden():
    req, _ = pd(ONE, url="http://127.0.0.1:9/v2/enqueue")
    assert req.url == "http://127.0.0.1:9/v2/enqueue"


def test_pagerduty_requires_a_routing_key():
    with pytest.raises(ValueError, match="routing_key"):
        formats.pagerduty(ONE, routing_key="", now=NOW)


def test_pagerduty_5000_character_summary_keeps_the_action():
    _, doc = pd(group(alert(0, summary="s" * 5000)))
    summary = doc["payload"]["summary"]
    assert len(summary) == 1024
    assert "s…" in summary and summary.endswith("READY again at 03:13")


def test_pagerduty_5000_character_action_is_cut_too():
    _, doc = pd(group(alert(0, summary="x" * 5000, action="a" * 5000)))
    summary = doc["payload"]["summary"]
    assert len(summary) <= 1024 and summary.endswith("a…") and "x…" in summary


def test_pagerduty_200_alerts_with_huge_evidence_stay_under_512_kb():
    n = group(*[alert(i, evidence={"log_tail": [f"line {j} " + "é" * 40 for j in range(50 + i)]})
                for i in range(200)])
    req, doc = pd(n)
    details = doc["payload"]["custom_details"]
    assert len(req.body) <= 512_000
    assert "truncated" in details and "512 KB" in details["truncated"]
    assert details["group"]["firing"] == 200  # small entries stay
    # The largest went first: the evidence of the alerts with the longest logs.
    assert "alert 200 PitstopStall evidence" not in details
    assert "alert 001 PitstopStall evidence" in details
    kept_alerts = [k for k in details if k.startswith("alert") and not k.endswith("evidence")]
    assert len(kept_alerts) == 200


def test_pagerduty_one_enormous_evidence_is_dropped_alone():
    n = group(alert(0, severity="page", evidence={"dump": "x" * 2_000_000}), alert(1))
    _, doc = pd(n)
    details = doc["payload"]["custom_details"]
    assert set(details) == {"group", "alert 1 PitstopStall", "alert 2 PitstopStall", "alert 2 PitstopStall evidence",
                            "truncated"}
    assert details["truncated"].startswith("1 of 5 entries left out")
    assert "alert 1 PitstopStall evidence" in details["truncated"]


def test_pagerduty_missing_runbook_links_the_console_only():
    _, doc = pd(group(alert(0, runbook=None)))
    assert doc["links"] == [{"href": f"{CONSOLE}/actions/100", "text": "Pitstop console"}]


def test_pagerduty_relative_links_are_left_out():
    n = replace(group(replace(alert(0, runbook="/runbooks/stall"), generator_url="/actions/1")), external_url="")
    _, doc = pd(n)
    assert "links" not in doc and "client_url" not in doc


# -- Slack ----------------------------------------------------------------------------------------------------


def test_slack_firing_one():
    req = formats.slack(ONE, url=SLACK_URL, now=NOW)
    assert req.url == SLACK_URL and req.ok == frozenset({200})
    doc = sl(ONE)
    assert doc["text"].startswith("🔴 [FIRING:1] PitstopStall: replica stalled — Pitstop: restarted")
    header, context, section = doc["blocks"]
    assert header["text"] == {"type": "plain_text", "text": "🔴 FIRING: PitstopStall", "emoji": True}
    assert context["type"] == "context" and "*1* firing" in context["elements"][0]["text"]
    text = section["text"]["text"]
    assert section["text"]["type"] == "mrkdwn"
    assert "*Pitstop:* restarted replica gpu-a/r2" in text
    assert f"<{CONSOLE}/actions/100|Console>" in text and "<https://runbooks.example.com/stall|Runbook>" in text
    assert "`replica=gpu-a/r0`" in text and "<!date^" in text


def test_slack_several_one_section_each_worst_first():
    doc = sl(SEVERAL)
    assert doc["blocks"][0]["text"]["text"] == "🔴 FIRING: PitstopXid (+2 more)"
    sections = [b["text"]["text"] for b in doc["blocks"] if b["type"] == "section"]
    assert len(sections) == 4
    assert sections[0].startswith("🔴 *PitstopXid*") and sections[1].startswith("🟠 *PitstopStall*")
    assert sections[2].startswith("🔵 *PitstopStall*") and "_Pitstop took no action._" in sections[2]
    assert sections[3].startswith("✅ *PitstopStall* · resolved")


def test_slack_resolved():
    doc = sl(RESOLVED)
    assert doc["blocks"][0]["text"]["text"] == "✅ RESOLVED: PitstopStall (+1 more)"
    assert doc["text"].startswith("✅ [RESOLVED:2]")


@pytest.mark.parametrize(("count", "truncated", "sections", "more"),
                         [(47, 0, 47, None), (48, 0, 48, None), (48, 3, 47, 4), (49, 0, 47, 2), (200, 0, 47, 153),
                          (200, 10, 47, 163)])
def test_slack_block_limit(count, truncated, sections, more):
    doc = sl(group(*[alert(i) for i in range(count)], truncated=truncated))
    blocks = doc["blocks"]
    assert len(blocks) <= 50
    assert sum(b["type"] == "section" for b in blocks) == sections
    if more is None:
        assert blocks[-1]["type"] == "section"
    else:
        assert blocks[-1]["type"] == "context" and len(blocks) == 50
        assert blocks[-1]["elements"][0]["text"].startswith(f"… and {more} more alerts")


def test_slack_5000_character_texts_are_cut_within_limits():
    n = group(alert(0, name="N" * 5000, summary="s" * 5000, action="a" * 5000))
    doc = sl(n)
    header = doc["blocks"][0]["text"]["text"]
    assert units(header) == 150 and header.endswith("…")  # the emoji counts two
    section = doc["blocks"][2]["text"]["text"]
    assert len(section) <= 3000
    # Each part keeps its share: the action and the links still show.
    assert "*Pitstop:* aaa" in section and "|Runbook>" in section and "|Console>" in section
    assert len(doc["text"]) <= 3000


def test_slack_counts_astral_characters_twice():
    doc = sl(group(alert(0, name="🔥" * 200, summary="🔥" * 3000)))
    assert units(doc["blocks"][0]["text"]["text"]) <= 150
    assert units(doc["blocks"][2]["text"]["text"]) <= 3000


def test_slack_escapes_mrkdwn_and_never_cuts_an_entity():
    doc = sl(group(alert(0, summary="p99 < 2s & queue > 10 <!channel>")))
    text = doc["blocks"][2]["text"]["text"]
    assert "p99 &lt; 2s &amp; queue &gt; 10 &lt;!channel&gt;" in text
    assert "<!channel>" not in doc["text"]
    for cut in range(880, 910):
        clipped = clip(_esc_all("&" * 2000), cut, mrkdwn=True)
        assert units(clipped) <= cut and clipped.removesuffix("…").endswith("&amp;")


def _esc_all(text: str) -> str:
    return text.replace("&", "&amp;")


def test_slack_link_urls_cannot_break_out():
    n = group(replace(alert(0, runbook="https://runbooks.example.com/a|b>c?x=1&y=2"), generator_url=CONSOLE))
    text = sl(n)["blocks"][2]["text"]["text"]
    assert "<https://runbooks.example.com/a%7Cb%3Ec?x=1&amp;y=2|Runbook>" in text


def test_slack_missing_runbook():
    text = sl(group(alert(0, runbook=None)))["blocks"][2]["text"]["text"]
    assert "Runbook" not in text and "no runbook" in text and "|Console>" in text


def test_slack_overlong_urls_are_left_out():
    n = group(replace(alert(0, runbook="https://runbooks.example.com/" + "r" * 3000),
                      generator_url=f"{CONSOLE}/" + "c" * 3000))
    text = sl(n)["blocks"][2]["text"]["text"]
    assert "|Console>" not in text and "|Runbook>" not in text


# -- Pitstop webhook ------------------------------------------------------------------------------------------


def test_webhook_shape_and_signature():
    req, doc = wh(SEVERAL)
    assert req.headers["X-Pitstop-Timestamp"] == str(int(NOW.timestamp()))
    assert req.headers["X-Pitstop-Signature"].startswith("sha256=")
    assert doc["version"] == "1" and doc["status"] == "firing" and doc["group_key"] == SEVERAL.group_key
    assert doc["group_labels"] == {"alertname": "PitstopStall", "model": "tiny-llama"}
    first = doc["alerts"][0]
    assert first["ends_at"] is None and first["action_summary"].startswith("restarted")
    assert first["evidence"] == {"stalled_seconds": 61.5, "last_tokens_per_s": 0.0}
    assert doc["alerts"][2]["ends_at"] == "2026-12-01T03:15:00Z"


def test_webhook_secret_may_be_text():
    req = formats.webhook(ONE, url="u", secret=SECRET.decode(), now=NOW)
    verify(SECRET, req.headers["X-Pitstop-Timestamp"], req.headers["X-Pitstop-Signature"], req.body, NOW)


def test_webhook_resolved():
    _, doc = wh(RESOLVED)
    assert doc["status"] == "resolved" and all(a["ends_at"] for a in doc["alerts"])


def test_webhook_200_alerts_all_go():
    _, doc = wh(group(*[alert(i) for i in range(200)]))
    assert len(doc["alerts"]) == 200
