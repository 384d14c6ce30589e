"""Silences and inhibition, pure: matching, the active window's edges, and each inhibition rule."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.notify.silencing import (
    AlertFacts,
    NodeFacts,
    Silence,
    inhibitions,
    mutes,
    parse_matchers,
    silence_state,
)
from tests.controlplane.fixtures import T0

STALL = {"alertname": "pitstop-stall", "target": "replica:gpu-a/r0", "severity": "warning", "model": "tiny-llama",
         "node": "gpu-a", "replica": "r0"}
TTFT = {"alertname": "pitstop-ttft-slo", "target": "replica:gpu-a/r1", "severity": "warning", "node": "gpu-a",
        "replica": "r1"}
XID = {"alertname": "pitstop-xid-hardware", "target": "gpu:gpu-a/0", "severity": "page", "node": "gpu-a"}
HOT = {"alertname": "pitstop-thermal", "target": "gpu:gpu-a/0", "severity": "warning", "node": "gpu-a"}
SUSTAINED = {"alertname": "pitstop-thermal-sustained", "target": "gpu:gpu-a/1", "severity": "warning",
             "node": "gpu-a"}
THROTTLED = {"alertname": "GPUThrottled", "node": "gpu-a", "gpu": "0", "severity": "warning"}
ELSEWHERE = {**STALL, "target": "replica:gpu-b/r0", "node": "gpu-b"}


def silence(*matchers: str, starts: float = 0, ends: float = 3600, sid: int = 1) -> Silence:
    return Silence(id=sid, matchers=parse_matchers(matchers), starts_at=T0 + timedelta(seconds=starts),
                   ends_at=T0 + timedelta(seconds=ends))


def facts(*labels: dict[str, str]) -> list[AlertFacts]:
    return [AlertFacts(id=i, labels=lab) for i, lab in enumerate(labels, start=1)]


# --- matching ----------------------------------------------------------------------------------------------------


def test_every_matcher_must_match_in_alertmanagers_syntax() -> None:
    s = silence('alertname="pitstop-stall"', "node=~gpu-.*", 'replica!="r9"')
    assert s.silences(STALL, T0)
    assert s.silences(ELSEWHERE, T0)
    assert not s.silences(TTFT, T0)
    assert not silence('{node="gpu-b"}').silences(STALL, T0)
    # Regexes are anchored, as in Alertmanager.
    assert not silence('alertname=~"stall"').silences(STALL, T0)
    assert silence('alertname!~"pitstop-(ttft|itl)-slo"', 'node="gpu-a"').silences(STALL, T0)


def test_a_matcher_on_a_missing_label_reads_it_as_empty() -> None:
    assert silence('alertname="pitstop-stall"', 'team=""').silences(STALL, T0)
    assert not silence('team="infra"').silences(STALL, T0)


def test_bad_matchers_are_refused_naming_each() -> None:
    with pytest.raises(ValueError) as caught:
        parse_matchers(['alertname="pitstop-stall"', "node~gpu-a", 'replica=~"r[0"'])
    text = str(caught.value)
    assert "'node~gpu-a'" in text and "'replica=~\"r[0\"'" in text and "pitstop-stall" not in text


def test_matchers_that_would_silence_every_alert_are_refused() -> None:
    for matchers in ([], ['alertname=~".*"'], ['team=""', 'node!="gpu-z"']):
        with pytest.raises(ValueError, match="matcher"):
            parse_matchers(matchers)


def test_matchers_come_back_in_canonical_form() -> None:
    assert [str(m) for m in parse_matchers(["node=gpu-a", '{alertname=~"pitstop-.*"}'])] == \
        ['node="gpu-a"', 'alertname=~"pitstop-.*"']


# --- the window --------------------------------------------------------------------------------------------------


def test_a_silence_applies_from_starts_at_up_to_not_including_ends_at() -> None:
    s = silence('alertname="pitstop-stall"', starts=60, ends=120)
    before, start, end = T0 + timedelta(seconds=59.999), T0 + timedelta(seconds=60), T0 + timedelta(seconds=120)
    assert s.state(before) == "pending" and not s.silences(STALL, before)
    assert s.state(start) == "active" and s.silences(STALL, start)
    assert s.state(end - timedelta(microseconds=1)) == "active" and s.silences(STALL, end - timedelta(microseconds=1))
    assert s.state(end) == "expired" and not s.silences(STALL, end)


def test_a_silence_expired_before_it_started_is_expired() -> None:
    # Expiring a pending silence moves both ends to that moment: an empty window never applies.
    assert silence_state(T0, T0, T0) == "expired"
    assert silence_state(T0, T0, T0 - timedelta(seconds=1)) == "expired"
    assert silence_state(T0 + timedelta(seconds=1), T0, T0) == "expired"


def test_mutes_lists_each_matching_active_silence() -> None:
    alerts = facts(STALL, TTFT)
    found = mutes(alerts, [silence('node="gpu-a"', sid=7), silence('replica="r0"', sid=3),
                           silence('replica="r1"', sid=9, starts=10)], {}, T0)
    assert found[1].silenced_by == (7, 3) and found[1].inhibited_by == ()
    assert found[2].silenced_by == (7,)
    assert mutes(alerts, [silence('node="gpu-a"', ends=1)], {}, T0 + timedelta(seconds=1)) == {}


# --- inhibition --------------------------------------------------------------------------------------------------


def test_a_hardware_xid_inhibits_the_replica_and_slo_alerts_of_its_node_only() -> None:
    alerts = facts(XID, STALL, TTFT, ELSEWHERE, HOT)
    found = inhibitions(alerts, {})
    assert found == {2: (1,), 3: (1,)}  # never the XID alert itself, nor gpu-b's, nor the node's GPU alerts


def test_a_cordoned_or_unreachable_node_inhibits_its_replica_alerts_with_a_reason() -> None:
    alerts = facts(STALL, ELSEWHERE, HOT)
    nodes = {"gpu-a": NodeFacts("gpu-a", cordoned=True), "gpu-b": NodeFacts("gpu-b", unreachable=True,
                                                                           last_report_at=T0)}
    found = inhibitions(alerts, nodes)
    assert found[1] == ("node gpu-a is cordoned",)
    assert found[2] == (f"node gpu-b is unreachable: no report since {T0.isoformat()}",)
    assert 3 not in found  # the GPU alert is about the node itself
    assert inhibitions(alerts, {"gpu-a": NodeFacts("gpu-a")}) == {}



def test_an_unreachable_node_never_mutes_its_own_page() -> None:
    dark = {"alertname": "pitstop-node-unreachable", "target": "node:gpu-b", "severity": "page", "node": "gpu-b"}
    alerts = facts(ELSEWHERE, dark)
    found = inhibitions(alerts, {"gpu-b": NodeFacts("gpu-b", unreachable=True, last_report_at=T0)})
    assert 1 in found and 2 not in found  # the replica's alert is noise beside the page; the page is the news

def test_causes_and_reasons_together_ids_first() -> None:
    alerts = facts(STALL, XID)
    assert inhibitions(alerts, {"gpu-a": NodeFacts("gpu-a", cordoned=True)}) == \
        {1: (2, "node gpu-a is cordoned")}


def test_the_inhibiting_alert_is_never_inhibited() -> None:
    # An XID alert that also names a replica would match its own rule: it stays loud.
    xid_on_replica = {**XID, "replica": "r0"}
    alerts = facts(xid_on_replica, STALL)
    assert inhibitions(alerts, {"gpu-a": NodeFacts("gpu-a", cordoned=True)}) == \
        {2: (1, "node gpu-a is cordoned")}


def test_a_hot_gpu_inhibits_throttling_alerts_on_that_gpu_only() -> None:
    other_gpu = {**THROTTLED, "gpu": "2"}
    by_target = {"alertname": "pitstop-gpu-throttling", "target": "gpu:gpu-a/1", "node": "gpu-a"}
    alerts = facts(HOT, THROTTLED, other_gpu, SUSTAINED, by_target)
    assert inhibitions(alerts, {}) == {2: (1,), 5: (4,)}
    # No hot GPU: the throttling alerts stand.
    assert inhibitions(facts(THROTTLED, by_target), {}) == {}


def test_a_silenced_cause_still_inhibits() -> None:
    alerts = facts(XID, STALL)
    found = mutes(alerts, [silence('alertname="pitstop-xid-hardware"')], {}, T0)
    assert found[1].silenced_by == (1,) and found[1].inhibited_by == ()
    assert found[2].silenced_by == () and found[2].inhibited_by == (1,)
