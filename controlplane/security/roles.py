"""Roles and the principal a request acts as: viewer reads, operator acts, admin manages tokens and policies.

``admin`` includes ``operator`` includes ``viewer``; ``agent`` is apart: it may only report (as its node).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    AGENT = "agent"


_RANK = {Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}


def role_allows(held: Role, needed: Role) -> bool:
    """Whether a token of role ``held`` may do what needs ``needed``."""
    if needed is Role.AGENT or held is Role.AGENT:
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
