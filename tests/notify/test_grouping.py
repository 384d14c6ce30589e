"""When a group is due a notification: the first page at group_wait, resolves together, repeats, and a breach
that recovered and came back pages again at once (where Alertmanager 0.25 waits for repeat_interval)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.notify.grouping import GroupState, Member, Timing, after_telling, due, members_to_tell

T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
S = timedelta(seconds=1)
TIMING = Timing(group_wait=10 * S, group_interval=60 * S, repeat_interval=4 * 3600 * S)


def firing(alert_id: int, at: datetime = T0) -> Member:
    return Member(alert_id=alert_id, status="firing", starts_at=at)


def resolved(alert_id: int, at: datetime = T0) -> Member:
    return Member(alert_id=alert_id, status="resolved", starts_at=at)


@pytest.mark.parametrize(("state", "alerts", "now", "expected"), [
    (GroupState(), [firing(1)], T0 + 9 * S, None),  # inside group_wait
    (GroupState(), [firing(1)], T0 + 10 * S, "new"),
    (GroupState(), [firing(1), firing(2, T0 + 5 * S)], T0 + 10 * S, "new"),  # the earliest starts the wait
    (GroupState(last_sent_at=T0, told={1: "firing"}), [firing(1)], T0 + 3600 * S, None),
    (GroupState(last_sent_at=T0, told={1: "firing"}), [firing(1)], T0 + 4 * 3600 * S, "repeat"),
    (GroupState(last_sent_at=T0, told={1: "firing"}), [resolved(1)], T0 + 30 * S, None),  # within group_interval
    (GroupState(last_sent_at=T0, told={1: "firing"}), [resolved(1)], T0 + 60 * S, "resolved"),
    (GroupState(last_sent_at=T0 + 50 * S, told={}), [resolved(1), firing(2, T0 + 40 * S)], T0 + 55 * S, "new"),
    (GroupState(), [resolved(1)], T0 + 3600 * S, None),  # never told: nothing to take back
    (GroupState(last_sent_at=T0, told={1: "firing"}), [], T0 + 5 * 3600 * S, None),  # its alerts are gone
], ids=["waits-group-wait", "first-page", "earliest-starts-wait", "quiet-while-unchanged", "repeats",
        "resolve-waits-group-interval", "resolve-goes-out", "new-alert-beside-a-resolve", "untold-resolve",
        "empty-group"])
def test_due(state: GroupState, alerts: list[Member], now: datetime, expected: str | None) -> None:
    assert due(state, alerts, TIMING, now) == expected


def test_a_breach_that_recovers_and_returns_within_group_interval_pages_again_at_once() -> None:
    # 03:00 fires and pages; 03:00:20 resolves (told at 03:01); 03:01:10 breaches again: a new alert row.
    state = GroupState(last_sent_at=T0 + 10 * S, told={1: "firing"})
    assert due(state, [resolved(1)], TIMING, T0 + 70 * S) == "resolved"
    state = GroupState(last_sent_at=T0 + 70 * S, told=after_telling(members_to_tell(state, [resolved(1)])))
    assert state.told == {}
    back = firing(2, T0 + 71 * S)
    # Alertmanager would hold this until repeat_interval (4 h) after 03:01; Pitstop pages at group_wait.
    assert due(state, [back], TIMING, T0 + 80 * S) is None
    assert due(state, [back], TIMING, T0 + 81 * S) == "new"


def test_resolves_are_not_sent_to_a_receiver_that_does_not_want_them() -> None:
    quiet = Timing(group_wait=0 * S, group_interval=60 * S, repeat_interval=3600 * S, send_resolved=False)
    assert due(GroupState(last_sent_at=T0, told={1: "firing"}), [resolved(1)], quiet, T0 + 3600 * S) is None


def test_a_notification_carries_the_firing_and_the_told_resolved_and_forgets_them_after() -> None:
    state = GroupState(last_sent_at=T0, told={1: "firing", 2: "firing"})
    alerts = [resolved(1), firing(2), firing(3), resolved(4)]
    told = members_to_tell(state, alerts)
    assert [m.alert_id for m in told] == [1, 2, 3]  # 4 was never told firing: nothing to resolve
    assert after_telling(told) == {2: "firing", 3: "firing"}


def test_alerts_joining_a_paged_incident_wait_for_the_groups_next_update() -> None:
    # 900 alerts paged at T0; 100 more of the same storm a second later go out together at group_interval.
    state = GroupState(last_sent_at=T0, told={i: "firing" for i in range(900)})
    storm = [firing(i) for i in range(900)] + [firing(i, T0 + S) for i in range(900, 1000)]
    assert due(state, storm, TIMING, T0 + 2 * S) is None
    assert due(state, storm, TIMING, T0 + 60 * S) == "new"


def test_a_breach_that_returns_before_its_resolve_went_out_pages_at_once() -> None:
    # Alert 1 (fingerprint f) was paged, resolved; before the group's resolve is due it breaches again (2, f).
    state = GroupState(last_sent_at=T0 + 10 * S, told={1: "firing"})
    gone = Member(alert_id=1, status="resolved", starts_at=T0, fingerprint="f")
    back = Member(alert_id=2, status="firing", starts_at=T0 + 30 * S, fingerprint="f")
    assert due(state, [gone, back], TIMING, T0 + 40 * S) == "new"  # group_wait after it began
    other = Member(alert_id=3, status="firing", starts_at=T0 + 30 * S, fingerprint="g")  # not a return
    assert due(state, [gone, other], TIMING, T0 + 40 * S) is None
