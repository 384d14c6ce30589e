"""The control plane's metrics read from the store: one read per scrape, every series every time.

``StoreCollector`` is a client_python custom collector. On each scrape it reads the store once (``read_store``)
and yields nodes by status, actions by kind and state, and the notification outbox. Every status and every
(kind, state) pair of the contract's tables is yielded, 0 where the store has none, so a count that drops to
nothing reads 0 instead of keeping its last value (the alert on ``state="proposed"`` clears once the last proposal
is decided). A database error during the read leaves those families out of that scrape, counts it in
``pitstop_cp_scrape_errors_total``, and the scrape still serves every other metric.

It also serves ``pitstop_cp_actions_total``, the counter of actions reaching a final state (see ``Telemetry``):
client_python's registry takes a counter ``pitstop_cp_actions_total`` and the gauge ``pitstop_cp_actions`` for one
name, so one collector owns both. The text format served on ``/metrics`` (0.0.4) keeps them apart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.fleet.queries import count_nodes_by_status
from controlplane.fleet.schemas import NodeStatus
from controlplane.notify.outbox import backlog
from controlplane.policy.kinds import ActionKind
from controlplane.policy.lifecycle import ActionState
from controlplane.store.db import session_scope
from controlplane.store.models import ActionRow

log = logging.getLogger(__name__)

# The product's interface: names and help texts as alert rules, dashboards and runbooks know them.
NODES = ("pitstop_cp_nodes", "Known nodes by status (updated on each scrape).")
ACTIONS = ("pitstop_cp_actions", "Actions in the store by kind and state (outcome), updated on each scrape.")
NOTIFICATIONS_PENDING = ("pitstop_cp_notifications_pending",
                         "Notifications in the outbox not yet sent (updated on each scrape).")
NOTIFICATION_OLDEST = ("pitstop_cp_notification_oldest_pending_seconds", "How long the oldest unsent "
                       "notification has waited (0 with none; updated on each scrape).")
SCRAPE_ERRORS = ("pitstop_cp_scrape_errors", "Scrapes of /metrics whose read of the store failed (that scrape "
                 "left out pitstop_cp_nodes, pitstop_cp_actions and the notification outbox gauges).")


@dataclass(frozen=True)
class StoreReading:
    nodes: dict[str, int]
    actions: dict[tuple[str, str], int]
    notifications_pending: int
    notification_oldest_pending_seconds: float


def read_store(sessions: sessionmaker[Session], clock: Callable[[], datetime],
               stale_after: timedelta) -> StoreReading:
    """One read of what the store-derived gauges show, in one session."""
    with session_scope(sessions) as session:
        now = clock()
        nodes = count_nodes_by_status(session=session, now=now, stale_after=stale_after)
        grouped = session.execute(select(ActionRow.kind, ActionRow.state, func.count())
                                  .group_by(ActionRow.kind, ActionRow.state)).all()
        pending, oldest = backlog(session, now)
    actions = {(str(kind), str(state)): int(n) for kind, state, n in grouped}
    return StoreReading(nodes={status.value: n for status, n in nodes.items()}, actions=actions,
                        notifications_pending=pending, notification_oldest_pending_seconds=oldest)


class StoreCollector(Collector):
    """The store's gauges, read on each scrape, the scrapes that could not read it, and the finished actions."""

    def __init__(self, read: Callable[[], StoreReading], finished: Counter) -> None:
        self._read = read
        self._finished = finished
        self._errors = 0
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        # Names only, so the registry checks them at registration without reading the store.
        yield GaugeMetricFamily(*NODES, labels=["status"])
        yield GaugeMetricFamily(*ACTIONS, labels=["kind", "state"])
        yield GaugeMetricFamily(*NOTIFICATIONS_PENDING)
        yield GaugeMetricFamily(*NOTIFICATION_OLDEST)
        yield CounterMetricFamily(*SCRAPE_ERRORS)
        yield from self._finished.describe()

    def collect(self) -> Iterable[Metric]:
        try:
            reading: StoreReading | None = self._read()
        except SQLAlchemyError as exc:
            log.warning("/metrics: the store could not be read (%s); serving the other metrics", type(exc).__name__)
            with self._lock:
                self._errors += 1
            reading = None
        if reading is not None:
            yield from _store_families(reading)
        with self._lock:
            errors = self._errors
        yield CounterMetricFamily(*SCRAPE_ERRORS, value=errors)
        yield from self._finished.collect()


def _store_families(reading: StoreReading) -> Iterator[Metric]:
    nodes = GaugeMetricFamily(*NODES, labels=["status"])
    for status in [s.value for s in NodeStatus]:
        nodes.add_metric([status], reading.nodes.get(status, 0))
    yield nodes
    actions = GaugeMetricFamily(*ACTIONS, labels=["kind", "state"])
    # Every pair of the contract's tables, then any that a stored row of a kind the table no longer knows adds.
    pairs = [(kind.value, state.value) for kind in ActionKind for state in ActionState]
    pairs += sorted(set(reading.actions) - set(pairs))
    for kind, state in pairs:
        actions.add_metric([kind, state], reading.actions.get((kind, state), 0))
    yield actions
    yield GaugeMetricFamily(*NOTIFICATIONS_PENDING, value=reading.notifications_pending)
    yield GaugeMetricFamily(*NOTIFICATION_OLDEST, value=reading.notification_oldest_pending_seconds)
