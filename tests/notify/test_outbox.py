"""The outbox: sent on the receiver's success code, retried with jitter and Retry-After on 429, 5xx and no
answer, failed at once on other 4xx with the body kept, and given up after max_attempts; all in a real store
against a real HTTP receiver on loopback."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from controlplane.notify.model import AlertView, Notification, Request, to_json
from controlplane.notify.outbox import FAILED, PENDING, SENT, Receiver, judge, send_due
from controlplane.store.db import make_engine, make_sessionmaker, migrate, session_scope
from controlplane.store.models import NotificationDelivery
from tests.notify.receiving import Receiving

T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
OK = frozenset({202})


@pytest.mark.parametrize(("code", "retry_after", "attempt", "status", "lo", "hi"), [
    (202, None, 1, SENT, None, None),
    (500, None, 1, PENDING, 0.0, 2.0),  # full jitter over the first backoff step
    (503, None, 4, PENDING, 0.0, 16.0),
    (429, 30.0, 1, PENDING, 30.0, 32.0),  # never sooner than Retry-After, spread over one backoff step after it
    (None, None, 2, PENDING, 0.0, 4.0),  # no answer at all: the receiver may be restarting
    (400, None, 1, FAILED, None, None),  # a refused payload will not fix itself
    (500, None, 10, FAILED, None, None),  # max_attempts
])
def test_what_an_answer_means(code: int | None, retry_after: float | None, attempt: int, status: str,
                              lo: float | None, hi: float | None) -> None:
    outcome = judge(code, OK, "invalid routing key", "" if code else "ConnectError: refused", retry_after,
                    attempt, 10, random.Random(7))
    assert outcome.status == status
    if lo is not None and hi is not None:
        assert outcome.retry_in is not None and lo <= outcome.retry_in <= hi
    if status == FAILED and code == 400:
        assert "invalid routing key" in outcome.error and "not retried" in outcome.error


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'outbox.db'}")
    migrate(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


def notification() -> Notification:
    alert = AlertView(fingerprint="f1", status="firing", labels={"alertname": "pitstop-stall"},
                      annotations={"summary": "gpu-a/r0 stalled"}, starts_at=T0, severity="page")
    return Notification(receiver="pager", group_key="pager/{model=llama}", group_labels={"model": "llama"},
                        alerts=[alert], external_url="https://pitstop.example.internal")


def queue(sessions: sessionmaker[Session], n: int = 1) -> list[int]:
    with session_scope(sessions) as session:
        rows = [NotificationDelivery(receiver="pager", attempt=1, status=PENDING, response_code=None, error="",
                                     created_at=T0, next_retry_at=T0, group_key="pager/{model=llama}",
                                     reason="new", notification=to_json(notification()), alert_ids=[1])
                for _ in range(n)]
        session.add_all(rows)
        session.flush()
        return [r.id for r in rows]


def receiver(url: str) -> Receiver:
    def render(n: Notification, now: datetime) -> Request:
        return Request(url=url, body=json.dumps({"summary": n.alerts[0].annotations["summary"]}).encode(), ok=OK)

    return Receiver(name="pager", render=render, max_attempts=3)


def delivery(sessions: sessionmaker[Session], delivery_id: int) -> NotificationDelivery:
    with sessions() as session:
        row = session.get(NotificationDelivery, delivery_id)
        assert row is not None
        session.expunge(row)
        return row


def test_a_receiver_that_fails_then_recovers_gets_the_notification_once(sessions: sessionmaker[Session]) -> None:
    hook = Receiving([503, 429], headers={"Retry-After": "20"})
    clock = [T0]
    try:
        [queued] = queue(sessions)
        with httpx.Client() as client:
            assert send_due(sessions=sessions, receivers={"pager": receiver(hook.url)}, client=client,
                            now=lambda: clock[0]) == {("pager", PENDING): 1}
            first = delivery(sessions, queued)
            assert first.attempt == 2 and first.response_code == 503 and first.next_retry_at is not None
            clock[0] = first.next_retry_at
            send_due(sessions=sessions, receivers={"pager": receiver(hook.url)}, client=client, now=lambda: clock[0])
            second = delivery(sessions, queued)
            assert second.response_code == 429 and second.next_retry_at is not None
            assert second.next_retry_at - clock[0] >= timedelta(seconds=20)  # Retry-After honoured
            # Not due yet: nothing is sent before its time.
            assert send_due(sessions=sessions, receivers={"pager": receiver(hook.url)}, client=client,
                            now=lambda: clock[0] + timedelta(seconds=5)) == {}
            clock[0] = second.next_retry_at
            send_due(sessions=sessions, receivers={"pager": receiver(hook.url)}, client=client, now=lambda: clock[0])
        done = delivery(sessions, queued)
        assert done.status == SENT and done.sent_at == clock[0] and done.response_code == 202
        assert len(hook.bodies) == 3 and hook.bodies[-1] == {"summary": "gpu-a/r0 stalled"}
    finally:
        hook.close()


def test_a_refusal_fails_at_once_with_the_receivers_answer_and_unknown_receivers_fail(
        sessions: sessionmaker[Session]) -> None:
    hook = Receiving([400])
    try:
        [refused] = queue(sessions)
        with httpx.Client() as client:
            send_due(sessions=sessions, receivers={"pager": receiver(hook.url)}, client=client, now=lambda: T0)
            [orphan] = queue(sessions)
            send_due(sessions=sessions, receivers={}, client=client, now=lambda: T0)
        assert delivery(sessions, refused).status == FAILED and "HTTP 400: nope" in delivery(sessions, refused).error
        assert delivery(sessions, orphan).status == FAILED and "no receiver named 'pager'" in delivery(
            sessions, orphan).error
    finally:
        hook.close()


def test_a_receiver_that_never_answers_is_given_up_after_max_attempts(sessions: sessionmaker[Session]) -> None:
    [queued] = queue(sessions)
    gone = receiver("http://127.0.0.1:9/hook")  # discard port: connection refused
    clock = [T0]
    with httpx.Client() as client:
        for _ in range(3):
            send_due(sessions=sessions, receivers={"pager": gone}, client=client, now=lambda: clock[0])
            clock[0] += timedelta(minutes=10)
    row = delivery(sessions, queued)
    assert row.status == FAILED and row.attempt == 3 and "gave up after 3 attempts" in row.error
