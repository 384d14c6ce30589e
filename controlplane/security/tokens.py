"""API tokens in the database: created with a role, shown once, kept only as a salted SHA-256, revocable.

A token reads ``pst_<id>_<secret>``: the id finds the row without scanning, the 256-bit random secret is what
proves possession. A fast salted hash is enough for a secret of that entropy (nothing to brute-force, unlike a
password), and it keeps the check cheap on the report path.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from pydantic import BaseModel
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from controlplane.security.roles import Role
from controlplane.store.models import ApiToken

PREFIX = "pst_"


class TokenOut(BaseModel):
    """A token as listed: never its hash or its secret."""

    id: int
    name: str
    role: Role
    node: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    replaced_by: int | None


class TokenCreated(TokenOut):
    token: str  # shown once


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(f"{salt}:{secret}".encode()).hexdigest()


def token_out(row: ApiToken) -> TokenOut:
    return TokenOut(id=row.id, name=row.name, role=Role(row.role), node=row.node, created_at=row.created_at,
                    expires_at=row.expires_at, revoked_at=row.revoked_at, last_used_at=row.last_used_at,
                    replaced_by=row.replaced_by)


def create_token(*, session: Session, name: str, role: Role, now: datetime, node: str | None = None,
                 expires_at: datetime | None = None) -> TokenCreated:
    if node is not None and role is not Role.AGENT:
        raise ValueError("only agent tokens are bound to a node")
    secret, salt = secrets.token_urlsafe(32), secrets.token_hex(16)
    row = ApiToken(name=name, role=role.value, node=node, salt=salt, hash=_digest(salt, secret), created_at=now,
                   expires_at=expires_at, revoked_at=None, last_used_at=None, replaced_by=None)
    session.add(row)
    session.flush()
    return TokenCreated(**token_out(row).model_dump(), token=f"{PREFIX}{row.id}_{secret}")


def list_tokens(*, session: Session, include_revoked: bool = True) -> list[TokenOut]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return [token_out(r) for r in session.scalars(query)]


def revoke_token(*, session: Session, token_id: int, now: datetime) -> TokenOut | None:
    row = session.get(ApiToken, token_id)
    if row is None:
        return None
    if row.revoked_at is None:
        row.revoked_at = now
    return token_out(row)


def rotate_token(*, session: Session, token_id: int, now: datetime,
                 overlap: timedelta = timedelta(0)) -> TokenCreated | None:
    """A replacement with the same name, role and node; the old one is revoked now or expires after ``overlap``."""
    old = session.get(ApiToken, token_id)
    if old is None or old.revoked_at is not None:
        return None
    new = create_token(session=session, name=old.name, role=Role(old.role), node=old.node, now=now,
                       expires_at=old.expires_at)
    old.replaced_by = new.id
    if overlap > timedelta(0):
        end = now + overlap
        old.expires_at = end if old.expires_at is None else min(old.expires_at, end)
    else:
        old.revoked_at = now
    return new


def parse_token_id(token: str) -> int | None:
    if not token.startswith(PREFIX):
        return None
    ident, sep, _ = token[len(PREFIX):].partition("_")
    return int(ident) if sep and ident.isdigit() and len(ident) < 12 else None


def matches(row: ApiToken, token: str) -> bool:
    secret = token[len(PREFIX):].partition("_")[2]
    return hmac.compare_digest(_digest(row.salt, secret), row.hash)


def usable(row: ApiToken, now: datetime) -> bool:
    return row.revoked_at is None and (row.expires_at is None or row.expires_at > now)


def count_usable(*, session: Session, now: datetime) -> int:
    query = select(func.count()).select_from(ApiToken).where(
        ApiToken.revoked_at.is_(None), or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now))
    return int(session.scalar(query) or 0)


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or plain seconds (for ``--expires-in`` and ``--overlap``)."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return timedelta(seconds=float(text[:-1]) * units[text[-1]])
        return timedelta(seconds=float(text))
    except ValueError as exc:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m)") from exc
