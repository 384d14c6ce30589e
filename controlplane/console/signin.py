"""Who is looking at the console, and with which token it reads and acts. Pure but for ``whoami``'s one GET.

A person signs in with their own API token: the console sends it and nothing else, so what they do is recorded
under that token's name (the API's ``requested_by``, its audit log). The token lives in the session's state,
never in the URL, the query string or a log line.

Two ways in without typing a token, both chosen by the operator:

- **behind a trusted proxy** (``PITSTOP_CONSOLE_USER_HEADER``): the header names the person, and the console
  uses its own service token (``PITSTOP_CONSOLE_SERVICE_TOKEN``). When the control plane lets that token act on
  behalf of people (a static token with ``on_behalf_of: true``), every read and write carries
  ``X-Pitstop-On-Behalf-Of: <person>``: the control plane records the person (the token beside it in the audit
  log) at the lower of the token's role and the person's (its ``people`` setting), and whoami's answer for the
  person is the role the buttons follow, so a viewer sees none. A service token without that permission only
  reads, without the header (the control plane refuses the header from it rather than record the token's name
  for the person): the person sees everything and acts after signing in with their own token. The proxy must
  drop the user header from what clients send, or anyone could name themselves.
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
from controlplane.security.roles import person_name_problem

Via = Literal["token", "console", "proxy", "read-only"]
ACTING_ROLES = frozenset({"operator", "admin"})
READING_ROLES = frozenset({"viewer", "operator", "admin"})


@dataclass(frozen=True)
class Identity:
    """The person the page names, the role the console's token has, and that token (never shown)."""

    name: str
    role: str
    via: Via
    token: str | None = field(default=None, repr=False)
    # The token's own name, when it is not the person's (a proxy-named person, with the service token).
    token_name: str | None = None
    # The control plane is open (no token exists): anyone may do anything, recorded as "anonymous".
    open_api: bool = False
    # The token may act on behalf of people (whoami's ``on_behalf_of``): the service token behind a proxy.
    delegates: bool = False
    # The person every read and write names in X-Pitstop-On-Behalf-Of (a proxy-named person, acting as
    # themself through the service token); None: the token acts as itself.
    on_behalf_of: str | None = None

    @property
    def can_act(self) -> bool:
        """Buttons only where writes carry the person's own name and their role may act: a token of one's own
        (or the console's own), or the service token acting on behalf of the proxy-named person."""
        if self.via == "proxy":
            return self.on_behalf_of is not None and self.role in ACTING_ROLES
        return self.via in ("token", "console") and (self.role in ACTING_ROLES or self.open_api)

    def describe(self) -> str:
        if self.via == "proxy" and self.on_behalf_of is not None:
            return f"{self.name} ({self.role}, named by the proxy; the console acts for you as {self.token_name})"
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


@dataclass(frozen=True)
class WhoAmI:
    """``GET /v1/whoami``'s answer: the token's name and role, or, for a person it acts for, theirs (``via``)."""

    name: str
    role: str
    anonymous: bool = False
    # The token may act on behalf of people.
    on_behalf_of: bool = False
    via: str | None = None


def whoami(client: httpx.Client) -> WhoAmI:
    """Who the client's token is (or the person its X-Pitstop-On-Behalf-Of names), from ``GET /v1/whoami``."""
    answer = _get(client, "/v1/whoami")
    via = answer.get("via")
    return WhoAmI(name=str(answer["name"]), role=str(answer["role"]), anonymous=bool(answer.get("anonymous")),
                  on_behalf_of=bool(answer.get("on_behalf_of")), via=None if via is None else str(via))


def identity_for(name: str, role: str, anonymous: bool, token: str | None, via: Via, *,
                 delegates: bool = False) -> Identity:
    """The identity a whoami answer gives, or SignInRefused for a token made for something else."""
    if not anonymous and role not in READING_ROLES:
        raise SignInRefused(f"that is an {role} token: sign in with a viewer, operator or admin token")
    return Identity(name=name, role=role, via=via, token=token, open_api=anonymous, delegates=delegates)


def proxy_user(headers: Mapping[str, str], header: str | None) -> str | None:
    """The person the trusted proxy names in ``header``, or None (no header configured, sent, or usable: the
    control plane's rule for a person's name, so a value it would refuse never reaches it)."""
    if not header:
        return None
    value = next((v for k, v in headers.items() if k.lower() == header.lower()), None)
    value = (value or "").strip()
    return value if person_name_problem(value) is None else None


def proxied(user: str, service: Identity, person: WhoAmI | None = None) -> Identity:
    """A proxy-named person with the console's service token. ``person``: whoami's answer for them through a
    service token that acts on behalf of people: they act as themself at that role. Without it they read with
    the service token as itself, and act only once signed in with their own token."""
    if person is None or person.via is None or person.name != user:  # not an answer for this person: read
        return Identity(name=user, role=service.role, via="proxy", token=service.token, token_name=service.name)
    return Identity(name=person.name, role=person.role, via="proxy", token=service.token,
                    token_name=person.via, on_behalf_of=person.name)


def read_only(settings: ConsoleSettings) -> Identity | None:
    """The anonymous visitor's identity when the operator configured a read-only console, else None."""
    if not settings.read_only:
        return None
    return Identity(name="anonymous", role="viewer", via="read-only", token=settings.service_token)
