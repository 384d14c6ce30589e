"""The agent's HTTP API, a plain ASGI app served by uvicorn inside the supervisor's asyncio loop.

``GET /healthz``                    the agent itself is up
``GET /metrics``                    Prometheus text (``agent.exporter``), one registry per agent
``GET /v1/replicas``                JSON list of ``ReplicaStatus``
``GET /v1/replicas/{name}``         one ``ReplicaStatus``
``GET /v1/replicas/{name}/ready``   200 only when READY, 503 otherwise, 404 unknown: for load balancers
``GET /engines/{name}/metrics``     the replica's engine's own /metrics, passed through (``agent.engine_proxy``)

Six fixed routes, so no framework: a load balancer asks each replica's readiness every second and Prometheus
reads every engine through here, and under FastAPI its middleware and dependency layers were most of each of
those requests (and its import a tenth of the agent's memory). HEAD is answered as GET without the body; any
other method is a 405 with ``Allow``; errors are ``{"detail": ...}`` as the control plane's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import time
from collections.abc import Awaitable, Callable, Generator, MutableMapping
from email.utils import formatdate
from typing import Any, Protocol

import httpx
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import TypeAdapter

from agent.engine_proxy import fetch_engine_metrics, scrape_timeout
from agent.wire import ReplicaStatus

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = "application/json"
_STATUSES = TypeAdapter(list[ReplicaStatus])


class AgentView(Protocol):
    """What the API reads from the running agent."""

    node: str
    registry: CollectorRegistry

    def statuses(self) -> list[ReplicaStatus]: ...

    def status_of(self, name: str) -> ReplicaStatus | None:
        """One replica's status (a load balancer's readiness check asks for one, often): None if unknown."""
        ...


def http_date(now: float) -> bytes:
    """The Date header for ``now``, made once per second and only when something is answered: uvicorn's own is
    brought up to date by a tick every second, even with nothing to answer (``EmbeddedServer``)."""
    return _http_date(int(now))


@functools.lru_cache(maxsize=1)
def _http_date(second: int) -> bytes:
    return formatdate(second, usegmt=True).encode()


async def _answer(send: Send, status: int, body: bytes, content_type: str, head: bool = False,
                  extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    headers = [(b"content-type", content_type.encode("latin-1")), (b"content-length", str(len(body)).encode()),
               (b"date", http_date(time.time())), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


def _detail(message: str) -> bytes:
    return json.dumps({"detail": message}).encode()


def create_app(view: AgentView, engine_client: httpx.AsyncClient | None = None) -> AsgiApp:
    # Made on the first proxied scrape, inside the serving loop; one client for every engine (kept-alive).
    clients: list[httpx.AsyncClient] = [engine_client] if engine_client is not None else []

    async def engine_metrics(status: ReplicaStatus, scope: Scope) -> tuple[int, bytes, str]:
        if not clients:
            clients.append(httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=64)))
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        timeout = scrape_timeout(headers.get("x-prometheus-scrape-timeout-seconds"))
        proxied = await fetch_engine_metrics(clients[0], status.url, headers, timeout)
        return proxied.status, proxied.body, proxied.content_type

    async def route(path: str, scope: Scope) -> tuple[int, bytes, str]:
        if path == "/healthz":
            return 200, json.dumps({"status": "ok", "node": view.node}).encode(), JSON
        if path == "/metrics":
            return 200, generate_latest(view.registry), CONTENT_TYPE_LATEST
        if path == "/v1/replicas":
            return 200, _STATUSES.dump_json(view.statuses()), JSON
        parts = path.split("/")
        replica = len(parts) in (4, 5) and parts[1:3] == ["v1", "replicas"] and parts[4:] in ([], ["ready"])
        engine = len(parts) == 4 and parts[1] == "engines" and parts[3] == "metrics"
        if replica or engine:  # /v1/replicas/{name}[/ready], /engines/{name}/metrics
            name = parts[3] if replica else parts[2]
            status = view.status_of(name)
            if status is None:
                return 404, _detail(f"no replica named {name!r} on node {view.node}"), JSON
            if engine:
                return await engine_metrics(status, scope)
            if len(parts) == 5:
                body = json.dumps({"replica": name, "state": status.state.value, "ready": status.ready})
                return (200 if status.ready else 503), body.encode(), JSON
            return 200, status.model_dump_json().encode(), JSON
        return 404, _detail("Not Found"), JSON

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # served with lifespan off; answered anyway, for any other server
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _answer(send, 405, _detail("Method Not Allowed"), JSON, extra=((b"allow", b"GET, HEAD"),))
            return
        try:
            status, body, content_type = await route(scope["path"], scope)
        except Exception:  # uvicorn would close the connection without an answer; the load balancer deserves one
            status, body, content_type = 500, _detail("Internal Server Error"), JSON
            await _answer(send, status, body, content_type, head=method == "HEAD")
            raise
        await _answer(send, status, body, content_type, head=method == "HEAD")

    return app


# How long the agent's server keeps an idle client connection: past Prometheus's usual scrape intervals (15-60 s),
# so each scrape of /metrics and /engines/<name>/metrics reuses its connection. uvicorn's own 5 s closed it
# between any two scrapes: a close and a new connection, two wakeups of the agent, per target per scrape.
KEEP_ALIVE_SECONDS = 75


def server_config(app: AsgiApp, host: str, port: int) -> uvicorn.Config:
    """The agent's HTTP server: quiet, no lifespan, no Date header of uvicorn's (the app sends one), and idle
    connections kept past a scrape interval (``KEEP_ALIVE_SECONDS``)."""
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", access_log=False,
                          date_header=False, timeout_keep_alive=KEEP_ALIVE_SECONDS)


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the agent owns SIGINT/SIGTERM (it must stop engines first)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()
        self._exit = asyncio.Event()

    def exit(self) -> None:
        self.should_exit = True
        self._exit.set()

    async def main_loop(self) -> None:
        """uvicorn's loop looks at ``should_exit`` ten times a second and makes its Date header every second: on
        an idle agent those wakeups were most of its CPU, and once a second they were still a twentieth of it at
        the default intervals. This one waits for ``exit``; the app sends its own Date (``http_date``), so
        uvicorn's is off (``date_header=False`` in ``server_config``)."""
        await self.on_tick(0)  # the default headers, without a Date
        await self._exit.wait()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()
