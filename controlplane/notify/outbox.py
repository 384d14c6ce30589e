"""The outbox: every notification leaves through ``notification_deliveries``, sent by the leader, at least once.

A delivery is written in the same transaction as the group's memory of what it told (``notifier.py``), so a
control plane killed at any moment either has the delivery queued or never decided to send it. Sending reads
the due rows, renders each with its receiver's format and secrets (never stored), posts it, and records the
outcome: sent on the tool's success code; retried on a timeout, a refused connection, 429 or 5xx, with doubling
backoff and full jitter, never sooner than the receiver's ``Retry-After``; failed at once on any other 4xx
(the body is recorded: a wrong routing key will not fix itself), or after ``max_attempts``. A delivery sent
but not yet marked when the process dies is sent again: receivers deduplicate by the group's key.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from agent.retry import next_attempt_in, retry_after_seconds
from controlplane.notify.model import Notification, Request, from_json
from controlplane.store.db import session_scope
from controlplane.store.models import NotificationDelivery

log = logging.getLogger(__name__)

PENDING, SENT, FAILED = "pending", "sent", "failed"
# Backoff: 2 s doubling to 5 minutes between attempts.
FIRST_RETRY_SECONDS = 2.0
RETRY_CAP_SECONDS = 300.0
# A response body kept with a failure, enough to read the receiver's complaint.
BODY_KEPT = 2000


@dataclass(frozen=True)
class Receiver:
    """A configured receiver as the outbox uses it: how to render a notification, and how hard to try."""

    name: str
    render: Callable[[Notification, datetime], Request]
    max_attempts: int = 10
    timeout_seconds: float = 10.0
    retry_cap_seconds: float = RETRY_CAP_SECONDS


@dataclass(frozen=True)
class Outcome:
    status: str  # pending (retry), sent, failed
    error: str = ""
    retry_in: float | None = None


def judge(code: int | None, ok: frozenset[int], body: str, error: str, retry_after: float | None, attempt: int,
          max_attempts: int, rng: random.Random, cap: float = RETRY_CAP_SECONDS) -> Outcome:
    """Pure: what one attempt's answer means (``code`` None: no answer at all)."""
    if code is not None and code in ok:
        return Outcome(SENT)
    what = error or f"HTTP {code}: {body[:BODY_KEPT]}"
    retryable = code is None or code == 429 or code >= 500
    if not retryable:
        return Outcome(FAILED, f"{what} (not retried: the receiver refused it)")
    if attempt >= max_attempts:
        return Outcome(FAILED, f"{what} (gave up after {attempt} attempts)")
    wait = next_attempt_in(attempt, FIRST_RETRY_SECONDS, retry_after, rng, cap=cap)
    return Outcome(PENDING, what, wait)


def _attempt(client: httpx.Client, receiver: Receiver, request: Request,
             now: datetime) -> tuple[int | None, str, str, float | None]:
    try:
        response = client.post(request.url, content=request.body,
                               headers={"Content-Type": "application/json", **request.headers},
                               timeout=receiver.timeout_seconds)
    except httpx.HTTPError as exc:
        return None, "", f"{type(exc).__name__}: {exc}".rstrip(": "), None
    return (response.status_code, response.text, "",
            retry_after_seconds(response.headers.get("Retry-After"), now))


def send_due(*, sessions: sessionmaker[Session], receivers: Mapping[str, Receiver], client: httpx.Client,
             now: Callable[[], datetime], rng: random.Random | None = None,
             limit: int = 200) -> dict[tuple[str, str], int]:
    """Send the deliveries that are due, each recorded in its own transaction; {(receiver, outcome): count}."""
    rng = rng or random.Random()
    with session_scope(sessions) as session:
        moment = now()
        due = [d.id for d in session.scalars(
            select(NotificationDelivery).where(NotificationDelivery.status == PENDING,
                                               NotificationDelivery.next_retry_at <= moment)
            .order_by(NotificationDelivery.next_retry_at, NotificationDelivery.id).limit(limit))]
    counts: dict[tuple[str, str], int] = {}
    for delivery_id in due:
        with session_scope(sessions) as session:
            delivery = session.get(NotificationDelivery, delivery_id)
            if delivery is None or delivery.status != PENDING:
                continue
            outcome = _send_one(delivery, receivers, client, now(), rng)
            _record(delivery, outcome, now())
            key = (delivery.receiver, outcome.status)
            counts[key] = counts.get(key, 0) + 1
    return counts


def _send_one(delivery: NotificationDelivery, receivers: Mapping[str, Receiver], client: httpx.Client,
              now: datetime, rng: random.Random) -> Outcome:
    receiver = receivers.get(delivery.receiver)
    if receiver is None:
        return Outcome(FAILED, f"no receiver named {delivery.receiver!r} is configured")
    try:
        notification = from_json(delivery.notification or {})
    except (KeyError, TypeError, ValueError) as exc:
        return Outcome(FAILED, f"the stored notification cannot be read: {exc!r}")
    request = receiver.render(notification, now)
    code, body, error, retry_after = _attempt(client, receiver, request, now)
    outcome = judge(code, request.ok, body, error, retry_after, delivery.attempt, receiver.max_attempts, rng,
                    receiver.retry_cap_seconds)
    delivery.response_code = code
    if outcome.status != SENT:
        log.warning("notification %s to %s: %s", delivery.id, delivery.receiver, outcome.error)
    return outcome


def _record(delivery: NotificationDelivery, outcome: Outcome, now: datetime) -> None:
    delivery.status, delivery.error = outcome.status, outcome.error
    if outcome.status == SENT:
        delivery.sent_at, delivery.next_retry_at = now, None
    elif outcome.status == FAILED:
        delivery.next_retry_at = None
    else:
        delivery.attempt += 1
        delivery.next_retry_at = now + timedelta(seconds=outcome.retry_in or 0.0)


def backlog(session: Session, now: datetime) -> tuple[int, float]:
    """(pending deliveries, seconds the oldest has waited) for /metrics."""
    count, oldest = session.execute(select(func.count(NotificationDelivery.id), func.min(
        NotificationDelivery.created_at)).where(NotificationDelivery.status == PENDING)).one()
    if not count or oldest is None:
        return 0, 0.0
    if oldest.tzinfo is None:  # an aggregate may come back without the column's zone
        oldest = oldest.replace(tzinfo=UTC)
    return int(count), max(0.0, (now - oldest).total_seconds())
