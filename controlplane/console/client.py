"""The console's only way to the fleet: the control-plane API over an injectable ``httpx.Client``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

ENV_API_URL = "PITSTOP_CONSOLE_API_URL"
ENV_TOKEN = "PITSTOP_CONSOLE_TOKEN"
ENV_REFRESH = "PITSTOP_CONSOLE_REFRESH_SECONDS"
DEFAULT_API_URL = "http://127.0.0.1:8000"


class ApiUnavailable(Exception):
    """The API could not be read; the message is meant for the person looking at the page."""


@dataclass(frozen=True)
class ConsoleSettings:
    api_url: str = DEFAULT_API_URL
    token: str | None = None
    refresh_seconds: float = 5.0
    timeout_seconds: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConsoleSettings:
        env = os.environ if env is None else env
        refresh = env.get(ENV_REFRESH, "")
        return cls(
            api_url=env.get(ENV_API_URL) or DEFAULT_API_URL,
            token=env.get(ENV_TOKEN) or None,
            refresh_seconds=float(refresh) if refresh else 5.0,
        )

    def client(self, transport: httpx.BaseTransport | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=self.timeout_seconds,
                            transport=transport)


@dataclass(frozen=True)
class FleetSnapshot:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def _get(client: httpx.Client, path: str, params: Mapping[str, Any] | None = None) -> Any:
    try:
        response = client.get(path, params=params)
    except httpx.HTTPError as exc:
        raise ApiUnavailable(f"cannot reach the control plane at {client.base_url} ({exc.__class__.__name__}: "
                             f"{exc}). Is 'pitstop server' running?") from exc
    if response.status_code in (401, 403):
        raise ApiUnavailable(f"the control plane refused the console's token (HTTP {response.status_code}); "
                             f"set it with 'pitstop console --token ...'")
    if response.status_code != 200:
        raise ApiUnavailable(f"the control plane answered {path} with HTTP {response.status_code}")
    return response.json()


def fetch_fleet(client: httpx.Client, *, events_limit: int = 50) -> FleetSnapshot:
    """Nodes, GPUs, replicas and recent events, read in four requests."""
    return FleetSnapshot(
        nodes=_get(client, "/v1/nodes"),
        gpus=_get(client, "/v1/gpus"),
        replicas=_get(client, "/v1/replicas"),
        events=_get(client, "/v1/events", {"limit": events_limit}),
    )


def fetch_samples(client: httpx.Client, *, node: str, replica: str, limit: int = 720) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = _get(client, f"/v1/replicas/{node}/{replica}/samples", {"limit": limit})
    return result
