"""The console's only way to the fleet: the control-plane API over an injectable ``httpx.Client``.

Reads raise ``ApiUnavailable`` with a line for the page; writes return an ``Outcome`` that carries the control
plane's own reason (its ``detail``) when it refuses, so the page shows why in the API's words.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from controlplane.security.roles import ON_BEHALF_OF_HEADER

ENV_API_URL = "PITSTOP_CONSOLE_API_URL"
# A token the console starts signed in with (the demo's, a console on one person's laptop). Optional.
ENV_TOKEN = "PITSTOP_CONSOLE_TOKEN"
ENV_REFRESH = "PITSTOP_CONSOLE_REFRESH_SECONDS"
# "1": anyone who reaches the console may look (never act) without signing in, with the service token if set.
ENV_READ_ONLY = "PITSTOP_CONSOLE_READ_ONLY"
# Behind a reverse proxy the operator trusts: the request header that names the person (e.g. X-Forwarded-User).
ENV_USER_HEADER = "PITSTOP_CONSOLE_USER_HEADER"
# The console's own token, for a proxy-named or read-only visitor. Behind a trusted proxy, a static token the
# control plane configures with ``on_behalf_of: true`` lets proxy-named people act as themselves; any other reads.
ENV_SERVICE_TOKEN = "PITSTOP_CONSOLE_SERVICE_TOKEN"
DEFAULT_API_URL = "http://127.0.0.1:8000"
_TRUE = frozenset({"1", "true", "yes", "on"})


class ApiUnavailable(Exception):
    """The API could not be read; the message is meant for the person looking at the page."""


class TokenRefused(ApiUnavailable):
    """The control plane answered 401 or 403: the token is unknown, revoked, or lacks the role."""


@dataclass(frozen=True)
class ConsoleSettings:
    api_url: str = DEFAULT_API_URL
    token: str | None = field(default=None, repr=False)
    refresh_seconds: float = 5.0
    timeout_seconds: float = 5.0
    read_only: bool = False
    user_header: str | None = None
    service_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConsoleSettings:
        env = os.environ if env is None else env
        refresh = env.get(ENV_REFRESH, "")
        return cls(
            api_url=env.get(ENV_API_URL) or DEFAULT_API_URL,
            token=env.get(ENV_TOKEN) or None,
            refresh_seconds=float(refresh) if refresh else 5.0,
            read_only=env.get(ENV_READ_ONLY, "").strip().lower() in _TRUE,
            user_header=env.get(ENV_USER_HEADER) or None,
            service_token=env.get(ENV_SERVICE_TOKEN) or None,
        )

    def client(self, token: str | None = None, transport: httpx.BaseTransport | None = None, *,
               on_behalf_of: str | None = None) -> httpx.Client:
        """A client for the API with ``token`` (the settings' own token when None), acting for the person
        ``on_behalf_of`` names when given (the token must be one the control plane lets act for people)."""
        return httpx.Client(base_url=self.api_url, headers=auth_headers(token if token is not None else self.token,
                                                                         on_behalf_of),
                            timeout=self.timeout_seconds, transport=transport, verify=tls_context())


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The console's one TLS context, with httpx's defaults (``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` honoured).

    Building a context loads the whole CA bundle, about 50 ms of CPU; a page run makes a client for each read
    and each action, so a context per client would cost every refresh a quarter of a second."""
    return httpx.create_ssl_context()


def auth_headers(token: str | None, on_behalf_of: str | None = None) -> dict[str, str]:
    """The headers of a request with ``token``, for the person ``on_behalf_of`` when given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if on_behalf_of is not None:
        headers[ON_BEHALF_OF_HEADER] = on_behalf_of
    return headers


@dataclass(frozen=True)
class Outcome:
    """How a write went: ``ok``, the line to show, and the API's answer (the action, the preview)."""

    ok: bool
    message: str
    status: int | None = None
    body: Any = None


def detail_of(response: httpx.Response) -> str:
    """The control plane's reason for an error answer: FastAPI's ``detail``, joined when it is a 422 list."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return response.text[:500] or f"HTTP {response.status_code}"
    if isinstance(detail, list):  # a 422: name each field as the API does, without the "body" prefix
        return "; ".join(_field_error(d) for d in detail)
    return str(detail) if detail else f"HTTP {response.status_code}"


def _field_error(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    where = ".".join(str(part) for part in error.get("loc") or [] if part != "body")
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))


def _get(client: httpx.Client, path: str, params: Mapping[str, Any] | None = None) -> Any:
    try:
        response = client.get(path, params=params)
    except httpx.HTTPError as exc:
        raise ApiUnavailable(f"cannot reach the control plane at {client.base_url} ({exc.__class__.__name__}: "
                             f"{exc}). Is 'pitstop server' running?") from exc
    if response.status_code in (401, 403):
        raise TokenRefused(f"the control plane refused the console's token (HTTP {response.status_code}: "
                           f"{detail_of(response)}); sign in with your own token")
    if response.status_code != 200:
        raise ApiUnavailable(f"the control plane answered {path} with HTTP {response.status_code}")
    return response.json()


def send(client: httpx.Client, method: str, path: str, *, json: Any = None,
         params: Mapping[str, Any] | None = None) -> Outcome:
    """One write; a refusal is an ``Outcome`` with the control plane's reason, never an exception."""
    try:
        response = client.request(method, path, json=json, params=params)
    except httpx.HTTPError as exc:
        return Outcome(False, f"cannot reach the control plane at {client.base_url} ({exc.__class__.__name__}); "
                              "nothing was done")
    if response.status_code >= 400:
        return Outcome(False, f"refused by the control plane (HTTP {response.status_code}): {detail_of(response)}",
                       response.status_code)
    body = response.json() if response.content else None
    return Outcome(True, "done", response.status_code, body)
