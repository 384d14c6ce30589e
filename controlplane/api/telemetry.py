"""The control plane's own Prometheus metrics, on a registry per app (two apps in one test never collide)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Reasons a report is refused; a fixed set so the label's cardinality is bounded.
REJECT_REASONS = ("unauthorized", "forbidden", "too_large", "malformed", "node_mismatch", "protocol_version")


class Telemetry:
    """Request latency, reports received/applied/rejected, and nodes by status."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
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
        self.nodes = Gauge(
            "pitstop_cp_nodes", "Known nodes by status (updated on each scrape).", ["status"],
            registry=self.registry,
        )
        for reason in REJECT_REASONS:
            self.reports_rejected.labels(reason=reason)

    def reject(self, reason: str) -> None:
        self.reports_rejected.labels(reason=reason).inc()

    async def middleware(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            self.request_seconds.labels(
                method=request.method, route=_route_template(request), status=str(status)
            ).observe(time.perf_counter() - start)


def _route_template(request: Request) -> str:
    # The template (/v1/nodes/{node}), never the raw path: node names must not become label values.
    # The router records the matched route in the scope it shares with this middleware.
    route = request.scope.get("route")
    return str(getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched")
