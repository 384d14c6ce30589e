"""The terminal's way to the control plane: where it is, whose token, and exit codes a script can rely on.

The URL and token come from, in order: ``--url`` / ``PITSTOP_URL`` / ``PITSTOP_TOKEN``, then the client file
(``PITSTOP_CONFIG``, else ``~/.config/pitstop/client.yaml``: ``url:`` and ``token:``), then
``http://127.0.0.1:8000`` with no token. The token never appears on a command line (where ``ps`` and shell
history would keep it) and is never printed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import httpx
import yaml

ENV_URL = "PITSTOP_URL"
ENV_TOKEN = "PITSTOP_TOKEN"
ENV_CONFIG = "PITSTOP_CONFIG"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_CONFIG = Path("~/.config/pitstop/client.yaml")


class Exit(IntEnum):
    """What ``pitstop status|replicas|actions|restart|drain|rollout|cordon|uncordon|silence`` exit with."""

    OK = 0
    # The guardrails hold the action (or would, with --dry-run); ``status``: a model is red or the breaker tripped.
    HELD = 1
    # Bad arguments, or a request the control plane refused as invalid (422).
    USAGE = 2
    # The control plane could not be reached, or failed (5xx).
    UNREACHABLE = 3
    # No token, or the token was refused (401), or its role may not do this (403).
    AUTH = 4
    NOT_FOUND = 5
    # The same action is already open (a rolling restart of the model, say).
    CONFLICT = 6
    # The action ran and failed or was rolled back (``--wait``).
    FAILED = 7


class OpsError(Exception):
    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None


def _config_file(env: Mapping[str, str]) -> Path:
    return Path(env.get(ENV_CONFIG) or DEFAULT_CONFIG).expanduser()


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise OpsError(Exit.USAGE, f"{path}: cannot read the client file: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict) or not set(data) <= {"url", "token"}:
        raise OpsError(Exit.USAGE, f"{path}: expected a mapping with 'url' and 'token' only")
    if data.get("token") and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise OpsError(Exit.USAGE, f"{path} holds a token and others may read it: chmod 600 {path}")
    return data


def resolve(url: str | None, env: Mapping[str, str] | None = None) -> Target:
    env = os.environ if env is None else env
    config = _read_config(_config_file(env))
    return Target(url=(url or env.get(ENV_URL) or config.get("url") or DEFAULT_URL).rstrip("/"),
                  token=env.get(ENV_TOKEN) or config.get("token") or None)


def client_for(target: Target, timeout: float = 10.0) -> httpx.Client:
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    return httpx.Client(base_url=target.url, headers=headers, timeout=timeout)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # pydantic's errors: field and message each
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', [])[1:])}: {e.get('msg')}" for e in detail
                         if isinstance(e, dict)) or str(detail)
    return str(detail)


def call(client: httpx.Client, method: str, path: str, *, params: Mapping[str, Any] | None = None,
         body: Any = None) -> Any:
    """The response's JSON, or OpsError with the exit code and the control plane's own reason."""
    try:
        response = client.request(method, path, params=params, json=body)
    except httpx.HTTPError as exc:
        raise OpsError(Exit.UNREACHABLE, f"cannot reach the control plane at {client.base_url}: "
                                         f"{exc.__class__.__name__}: {exc}") from exc
    code = response.status_code
    if code < 400:
        return response.json() if response.content else None
    reason = _detail(response)
    if code == 401:
        hint = "no token: set PITSTOP_TOKEN or the client file" if "Authorization" not in client.headers else \
            "the token was refused"
        raise OpsError(Exit.AUTH, f"{hint} ({reason})")
    if code == 403:
        raise OpsError(Exit.AUTH, f"not allowed: {reason}")
    if code == 404:
        raise OpsError(Exit.NOT_FOUND, reason)
    if code == 409:
        raise OpsError(Exit.CONFLICT, reason)
    if code in (400, 422):
        raise OpsError(Exit.USAGE, f"the control plane refused the request: {reason}")
    raise OpsError(Exit.UNREACHABLE, f"the control plane failed (HTTP {code}): {reason}")
