"""Roles and the principal a request acts as: viewer reads, operator acts, admin manages tokens and policies.

``admin`` includes ``operator`` includes ``viewer``; ``agent`` and ``alertmanager`` are apart: an agent may only
report (as its node), an Alertmanager may only post its alerts. A leaked webhook credential then writes alerts,
never fleet state, and moves the fleet only as far as a policy's ``alert`` condition and its guardrails allow.

A token configured with ``on_behalf_of`` may act for a person a trusted proxy named (the console's service token
behind a reverse proxy): the principal is then that person, at the lower of the token's role and the person's,
and ``via`` keeps the token's name for the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    AGENT = "agent"
    ALERTMANAGER = "alertmanager"


# The person a token configured with ``on_behalf_of`` acts for (the console sends it behind a trusted proxy).
ON_BEHALF_OF_HEADER = "X-Pitstop-On-Behalf-Of"
_RANK = {Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}
# The roles a person may hold; an agent or an Alertmanager is never a person, and never acts for one.
PERSON_ROLES = frozenset(_RANK)
# A person's name is recorded where a token's name would be (``requested_by``, the audit log's actor): columns
# of 128 characters. Names the control plane records for itself are not a person's: "anonymous" (open mode),
# "policy" (the policies' own actions, ``remediation.loop.REQUESTED_BY``), and "config:..." (static tokens).
MAX_PERSON_LENGTH = 128
RESERVED_NAMES = frozenset({"anonymous", "policy"})
RESERVED_PREFIX = "config:"
# Roles outside the ranking: each may do only its own one thing, and nothing else may do it.
_APART = frozenset({Role.AGENT, Role.ALERTMANAGER})


def role_allows(held: Role, needed: Role) -> bool:
    """Whether a token of role ``held`` may do what needs ``needed``."""
    if needed in _APART or held in _APART:
        return held is needed
    return _RANK[held] >= _RANK[needed]


def lower_role(a: Role, b: Role) -> Role:
    """The less powerful of two person roles (what a token acting for a person may do: neither more than it)."""
    return a if _RANK[a] <= _RANK[b] else b


def person_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a person, or None. Printable ASCII only: HTTP carries header values as Latin-1,
    so anything else would reach the audit log garbled, and a control character could forge a log line."""
    if not name or name != name.strip():
        return "is empty or has leading or trailing spaces"
    if len(name) > MAX_PERSON_LENGTH:
        return f"is longer than {MAX_PERSON_LENGTH} characters"
    if not all(32 <= ord(c) < 127 for c in name):
        return "holds a control or non-ASCII character (printable ASCII only)"
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIX):
        return "is a name the control plane records for itself, not a person's"
    return None


@dataclass(frozen=True)
class Principal:
    """Who a request acts as; ``name`` goes into the audit log and ``requested_by`` (never the token)."""

    name: str
    role: Role
    # Agent tokens made for one node may report only as that node; None means any node (a fleet token).
    node: str | None = None
    token_id: int | None = None
    # True in open local mode (no token exists anywhere): anyone may do anything, and it is logged loudly.
    anonymous: bool = False
    # The token may act on behalf of people a trusted proxy names (a static token with ``on_behalf_of: true``).
    on_behalf_of: bool = False
    # Acting for a person (``name``): the name of the token that carried the request, for the audit log.
    via: str | None = None

    def may_report_as(self, node: str) -> bool:
        return self.node is None or self.node == node


ANONYMOUS = Principal(name="anonymous", role=Role.ADMIN, anonymous=True)
