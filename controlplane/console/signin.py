"""Who is looking at the console, and with which token it reads and acts. Pure but for ``whoami``'s one GET.

A person signs in with their own API token: the console sends it and nothing else, so what they do is recorded
under that token's name (the API's ``requested_by``, its audit log). The token lives in the session's state,
never in the URL, the query string or a log line.

Two ways in without typing a token, both chosen by the operator:

- **behind a trusted proxy** (``PITSTOP_CONSOLE_USER_HEADER``): the header names the person, and the console
  reads with its own service token. The control plane records a write under the token that made it, so the
  console never acts with the service token on someone's behalf: a proxy-named person sees everything and acts
  only after signing in with their own token.
- **read-only** (``PITSTOP_CONSOLE_READ_ONLY``): anyone who reaches the console may look, never act.

A token the console was started with (``PITSTOP_CONSOLE_TOKEN``: the demo, one person's laptop) signs every
session in as that token until someone signs out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import httpx

from controlplane.console.client import ConsoleSettings, _get

Via = Literal["token", "console", "proxy", "read-only"]
ACTING_ROLES = frozenset({"operator", "admin"})
READING_ROLES = frozenset({"viewer", "operator", "admin"})
# A header value longer than this is not a user name (a proxy misconfigured to pass something else).
MAX_USER_LENGTH = 200


@dataclass(frozen=True)
class Identity:
    """The person the page names, the role the console's token has, and that token (never shown)."""

    name: str
    role: str
    via: Via
    token: str | None = field(default=None, repr=False)
    # The token's own name, when it is not the person's (a proxy-named person reading with the service token).
    token_name: str | None = None
    # The control plane is open (no token exists): anyone may do anything, recorded as "anonymous".
    open_api: bool = False

    @property
    def can_act(self) -> bool:
        """Buttons only for a token of one's own (or the console's own) that may act: writes carry its name."""
        return self.via in ("token", "console") and (self.role in ACTING_ROLES or self.open_api)

    def describe(self) -> str:
        if self.via == "proxy":
            return (f"{self.name} (named by the proxy), reading as {self.token_name} ({self.role}); sign in with "
                    "your own token to act")
        if self.via == "read-only":
            return "not signed in: read-only console"
        if self.open_api:
            return "the control plane is open (no API token exists): anyone may act, recorded as anonymous"
        return f"{self.name} ({self.role})"


class SignInRefused(Exception):
    """The token is not one a person can use the console with; the message says why."""


def whoami(client: httpx.Client) -> tuple[str, str, bool]:
    """(name, role, anonymous) of the client's token, from ``GET /v1/whoami``."""
    answer = _get(client, "/v1/whoami")
    return str(answer["name"]), str(answer["role"]), bool(answer.get("anonymous"))


def identity_for(name: str, role: str, anonymous: bool, token: str | None, via: Via) -> Identity:
    """The identity a whoami answer gives, or SignInRefused for a token made for something else."""
    if not anonymous and role not in READING_ROLES:
        raise SignInRefused(f"that is an {role} token: sign in with a viewer, operator or admin token")
    return Identity(name=name, role=role, via=via, token=token, open_api=anonymous)


def proxy_user(headers: Mapping[str, str], header: str | None) -> str | None:
    """The person the trusted proxy names in ``header``, or None (no header configured, sent, or usable)."""
    if not header:
        return None
    value = next((v for k, v in headers.items() if k.lower() == header.lower()), None)
    value = (value or "").strip()
    if not value or len(value) > MAX_USER_LENGTH or any(ord(c) < 32 for c in value):
        return None
    return value


def proxied(user: str, service: Identity) -> Identity:
    """A proxy-named person reading with the console's service token: they see, and act only once signed in."""
    return Identity(name=user, role=service.role, via="proxy", token=service.token, token_name=service.name)


def read_only(settings: ConsoleSettings) -> Identity | None:
    """The anonymous visitor's identity when the operator configured a read-only console, else None."""
    if not settings.read_only:
        return None
    return Identity(name="anonymous", role="viewer", via="read-only", token=settings.service_token)
