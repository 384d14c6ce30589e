"""Roles and the principal a request acts as: viewer reads, operator acts, admin manages tokens and policies.

``admin`` includes ``operator`` includes ``viewer``; ``agent`` and ``alertmanager`` are apart: an agent may only
report (as its node), an Alertmanager may only post its alerts. A leaked webhook credential then writes alerts,
never fleet state, and moves the fleet only as far as a policy's ``alert`` condition and its guardrails allow.
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


_RANK = {Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}
# Roles outside the ranking: each may do only its own one thing, and nothing else may do it.
_APART = frozenset({Role.AGENT, Role.ALERTMANAGER})


def role_allows(held: Role, needed: Role) -> bool:
    """Whether a token of role ``held`` may do what needs ``needed``."""
    if needed in _APART or held in _APART:
        return held is needed
    return _RANK[held] >= _RANK[needed]


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

    def may_report_as(self, node: str) -> bool:
        return self.node is None or self.node == node


ANONYMOUS = Principal(name="anonymous", role=Role.ADMIN, anonymous=True)
