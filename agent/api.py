"""The agent's HTTP API (FastAPI), served by uvicorn inside the supervisor's asyncio loop.

``GET /healthz``                    the agent itself is up
``GET /metrics``                    Prometheus text (``agent.exporter``), one registry per agent
``GET /v1/replicas``                JSON list of ``ReplicaStatus``
``GET /v1/replicas/{name}``         one ``ReplicaStatus``
``GET /v1/replicas/{name}/ready``   200 only when READY, 503 otherwise, 404 unknown: for load balancers
"""

from __future__ import annotations

from typing import Protocol

from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent.wire import ReplicaStatus


class AgentView(Protocol):
    """What the API reads from the running agent."""

    node: str
    registry: CollectorRegistry

    def statuses(self) -> list[ReplicaStatus]: ...


def create_app(view: AgentView) -> FastAPI:
    app = FastAPI(title=f"pitstop agent {view.node}", docs_url=None, redoc_url=None, openapi_url=None)

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

    return app
