"""The agent's HTTP API (FastAPI), served by uvicorn inside the supervisor's asyncio loop.

``GET /healthz``                    the agent itself is up
``GET /metrics``                    Prometheus text (``agent.exporter``), one registry per agent
``GET /v1/replicas``                JSON list of ``ReplicaStatus``
``GET /v1/replicas/{name}``         one ``ReplicaStatus``
``GET /v1/replicas/{name}/ready``   200 only when READY, 503 otherwise, 404 unknown: for load balancers
``GET /engines/{name}/metrics``     the replica's engine's own /metrics, passed through (``agent.engine_proxy``)
"""

from __future__ import annotations

from typing import Protocol

import httpx
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent.engine_proxy import fetch_engine_metrics, scrape_timeout
from agent.wire import ReplicaStatus


class AgentView(Protocol):
    """What the API reads from the running agent."""

    node: str
    registry: CollectorRegistry

    def statuses(self) -> list[ReplicaStatus]: ...


def create_app(view: AgentView, engine_client: httpx.AsyncClient | None = None) -> FastAPI:
    app = FastAPI(title=f"pitstop agent {view.node}", docs_url=None, redoc_url=None, openapi_url=None)
    # Made on the first proxied scrape, inside the serving loop; one client for every engine (kept-alive).
    clients: list[httpx.AsyncClient] = [engine_client] if engine_client is not None else []

    def find(name: str) -> ReplicaStatus:
        for status in view.statuses():
            if status.name == name:
                return status
        raise HTTPException(status_code=404, detail=f"no replica named {name!r} on node {view.node}")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "node": view.node}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(view.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/replicas")
    def replicas() -> list[ReplicaStatus]:
        return view.statuses()

    @app.get("/v1/replicas/{name}")
    def replica(name: str) -> ReplicaStatus:
        return find(name)

    @app.get("/v1/replicas/{name}/ready")
    def ready(name: str) -> JSONResponse:
        status = find(name)
        return JSONResponse({"replica": name, "state": status.state.value, "ready": status.ready},
                            status_code=200 if status.ready else 503)

    @app.get("/engines/{name}/metrics")
    async def engine_metrics(name: str, request: Request) -> Response:
        status = find(name)
        if not clients:
            clients.append(httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=64)))
        timeout = scrape_timeout(request.headers.get("x-prometheus-scrape-timeout-seconds"))
        proxied = await fetch_engine_metrics(clients[0], status.url, dict(request.headers), timeout)
        return Response(proxied.body, status_code=proxied.status, media_type=proxied.content_type)

    return app
