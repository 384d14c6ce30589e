"""The control plane's own Prometheus metrics, on a registry per app (two apps in one test never collide)."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.store_metrics import StoreCollector, StoreReading
from controlplane.policy.kinds import ActionKind
from controlplane.policy.lifecycle import FINAL, ActionState
from pitstop import __version__

# Reasons a report is refused; a fixed set so the label's cardinality is bounded.
REJECT_REASONS = ("unauthorized", "forbidden", "too_large", "malformed", "node_mismatch", "protocol_version",
                  "clock_skew", "backlogged", "database_unavailable")
# Reasons an Alertmanager webhook payload is refused, likewise fixed.
ALERTMANAGER_REJECT_REASONS = ("unauthorized", "forbidden", "too_large", "malformed", "version")
# What an Alertmanager alert was mapped to.
ALERTMANAGER_TARGET_KINDS = ("replica", "node", "model", "unmapped")


class Telemetry:
    """Request latency, reports received/applied/rejected, Alertmanager payloads, actions finished, the process and
    the build; ``serve_store`` adds what is read from the store on each scrape (``store_metrics``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._led_since = 0.0
        self._round_ended = 0.0
        self.request_seconds = Histogram(
            "pitstop_cp_request_duration_seconds", "Control-plane HTTP request latency.",
            ["method", "route", "status"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.reports_received = Counter(
            "pitstop_cp_reports_received_total", "Agent reports received, by what was done with them.",
            ["outcome"], registry=self.registry,
        )
        self.reports_rejected = Counter(
            "pitstop_cp_reports_rejected_total", "Agent reports refused, by reason.",
            ["reason"], registry=self.registry,
        )
        self.leader = Gauge(
            "pitstop_cp_leader", "1 while this control plane is the leader (runs the scheduler and executor).",
            registry=self.registry,
        )
        self.leader_since = Gauge(
            "pitstop_cp_leader_since_timestamp_seconds", "When this control plane took the lead (Unix time); 0 while "
            "it follows.", registry=self.registry,
        )
        self.policy_round_end = Gauge(
            "pitstop_cp_policy_round_end_timestamp_seconds", "When this control plane's last policy round ended "
            "(Unix time): with the leader's since, how long a new leader went without a round.",
            registry=self.registry,
        )
        self.history_samples = Gauge(
            "pitstop_cp_policy_history_samples", "Samples the policy rounds hold in memory: the leader's window, "
            "or a warm standby's (updated on each scrape).", registry=self.registry,
        )
        self.shards_held = Gauge(
            "pitstop_cp_policy_shards_held", "Shards of the policy rounds this control plane judges: every one on "
            "the leader, a fair share of policy_shards + 1 each when rounds are spread (updated on each scrape).",
            registry=self.registry,
        )
        self.policy_round_seconds = Histogram(
            "pitstop_cp_policy_round_seconds", "Duration of one policy round on the leader (snapshot, evaluation, "
            "guardrails, records).", registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.report_batch_size = Histogram(
            "pitstop_cp_report_batch_size", "Agent reports committed together in one transaction by the report "
            "writer (grows with load: group commit).", registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64),
        )
        self.report_backlog = Gauge(
            "pitstop_cp_report_backlog", "Agent reports received and not yet written (updated on each scrape).",
            registry=self.registry,
        )
        self.notifications = Counter(
            "pitstop_cp_notifications_total", "Notification attempts by receiver and outcome (sent; pending: to be "
            "retried; failed: given up).", ["receiver", "outcome"], registry=self.registry,
        )
        self.alertmanager_rejected = Counter(
            "pitstop_cp_alertmanager_rejected_total", "Alertmanager webhook payloads refused, by reason (nothing of "
            "a refused payload is stored).", ["reason"], registry=self.registry,
        )
        self.alertmanager_alerts = Counter(
            "pitstop_cp_alertmanager_alerts_total", "Alerts received from Alertmanager, by what their labels "
            "mapped to (replica, node, model, or unmapped).", ["target"], registry=self.registry,
        )
        # In no registry of its own: the store collector serves it beside pitstop_cp_actions (see store_metrics).
        self.actions_finished = Counter(
            "pitstop_cp_actions_total", "Actions that reached a final state, by kind and outcome (the final state), "
            "counted when the change commits. Per control-plane process (its policy process included): sum across "
            "control-plane instances.", ["kind", "outcome"], registry=None,
        )
        self.build_info = Gauge(
            "pitstop_build_info", "The running Pitstop and Python versions (always 1).", ["version", "python"],
            registry=self.registry,
        )
        self.build_info.labels(version=__version__, python=platform.python_version()).set(1)
        ProcessCollector(registry=self.registry)
        for action_kind in ActionKind:  # every child from the start, so increase() sees the first one
            for outcome in sorted(FINAL):
                self.actions_finished.labels(kind=action_kind.value, outcome=outcome.value)
        for reason in REJECT_REASONS:
            self.reports_rejected.labels(reason=reason)
        for reason in ALERTMANAGER_REJECT_REASONS:
            self.alertmanager_rejected.labels(reason=reason)
        for kind in ALERTMANAGER_TARGET_KINDS:
            self.alertmanager_alerts.labels(target=kind)

    def lead(self, leads: bool, now: float) -> None:
        """The election's verdict at ``now`` (Unix time): the leader gauge, and since when this term began."""
        self.leader.set(1 if leads else 0)
        if not leads:
            self._led_since = 0.0
        elif not self._led_since:
            self._led_since = now
        self.leader_since.set(self._led_since)

    def policy_round(self, seconds: float, ended_at: float) -> None:
        """One policy round took ``seconds`` and ended at ``ended_at`` (Unix time)."""
        self.policy_round_seconds.observe(seconds)
        self._round_ended = max(ended_at, self._round_ended)
        self.policy_round_end.set(self._round_ended)

    def reject(self, reason: str) -> None:
        self.reports_rejected.labels(reason=reason).inc()

    def reject_alertmanager(self, reason: str) -> None:
        self.alertmanager_rejected.labels(reason=reason).inc()

    def count_finished(self, kind: str, state: ActionState) -> None:
        """One action of ``kind`` reached the final ``state`` (``remediation.finished.watch``'s hook)."""
        self.actions_finished.labels(kind=kind, outcome=state.value).inc()

    def serve_store(self, read: Callable[[], StoreReading]) -> None:
        """Serve the store's gauges, ``read`` once per scrape, and ``pitstop_cp_actions_total`` with them."""
        self.registry.register(StoreCollector(read, finished=self.actions_finished))


class TelemetryMiddleware:
    """Pure ASGI middleware timing every HTTP request (Starlette's BaseHTTPMiddleware costs a task and a
    stream per request, which showed at 200 reports a second)."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            self.telemetry.request_seconds.labels(
                method=scope["method"], route=_route_template(scope), status=str(status)
            ).observe(time.perf_counter() - start)


def _route_template(scope: Scope) -> str:
    # The template (/v1/nodes/{node}), never the raw path: node names must not become label values.
    # The router records the matched route in the scope it shares with this middleware.
    route = scope.get("route")
    return str(getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched")
