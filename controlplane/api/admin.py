"""Admin endpoints (tokens, the audit log) and the alert list. Token secrets are returned once, never logged."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field

from agent.wire import NAME_PATTERN
from controlplane import audit
from controlplane.alerts import AlertDetailOut, AlertOut, get_alert, list_alerts, resolve_by_hand
from controlplane.api.context import (
    Admin,
    Ctx,
    Db,
    RowId,
    client_address,
    require_operator,
    require_reader,
)
from controlplane.security import tokens
from controlplane.security.roles import Principal, Role

router = APIRouter(prefix="/v1", tags=["admin"])


class TokenRequest(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    role: Role
    node: str | None = Field(default=None, pattern=NAME_PATTERN)
    expires_in_seconds: float | None = Field(default=None, gt=0, le=10 * 365 * 86400)


class RotateRequest(BaseModel):
    overlap_seconds: float = Field(default=0, ge=0, le=30 * 86400)


@router.get("/tokens", response_model=list[tokens.TokenOut], summary="API tokens (never their secrets)")
def token_list(session: Db, _: Admin) -> list[tokens.TokenOut]:
    return tokens.list_tokens(session=session)


@router.post("/tokens", response_model=tokens.TokenCreated, status_code=201,
             summary="Create a token; the answer is the only time its secret is shown")
def token_create(body: TokenRequest, request: Request, ctx: Ctx, session: Db, who: Admin) -> tokens.TokenCreated:
    if body.node is not None and body.role is not Role.AGENT:
        raise HTTPException(422, "node is only for agent tokens")
    now = ctx.clock()
    expires = None if body.expires_in_seconds is None else now + timedelta(seconds=body.expires_in_seconds)
    created = tokens.create_token(session=session, name=body.name, role=body.role, node=body.node, now=now,
                                  expires_at=expires)
    audit.record(session=session, who=who, what="token.create", target=f"token:{created.id}", now=now,
                 client=client_address(request), detail={"name": body.name, "role": body.role.value})
    session.commit()
    ctx.auth.invalidate()
    return created


@router.post("/tokens/{token_id}/revoke", response_model=tokens.TokenOut, summary="Revoke a token now")
def token_revoke(token_id: RowId, request: Request, ctx: Ctx, session: Db, who: Admin) -> tokens.TokenOut:
    now = ctx.clock()
    out = tokens.revoke_token(session=session, token_id=token_id, now=now)
    if out is None:
        raise HTTPException(404, f"no token {token_id}")
    audit.record(session=session, who=who, what="token.revoke", target=f"token:{token_id}", now=now,
                 client=client_address(request))
    session.commit()
    ctx.auth.invalidate()
    return out


@router.post("/tokens/{token_id}/rotate", response_model=tokens.TokenCreated,
             summary="Replace a token; the old one stops working now or after the overlap")
def token_rotate(token_id: RowId, body: RotateRequest, request: Request, ctx: Ctx, session: Db,
                 who: Admin) -> tokens.TokenCreated:
    now = ctx.clock()
    created = tokens.rotate_token(session=session, token_id=token_id, now=now,
                                  overlap=timedelta(seconds=body.overlap_seconds))
    if created is None:
        raise HTTPException(404, f"no usable token {token_id}")
    audit.record(session=session, who=who, what="token.rotate", target=f"token:{token_id}", now=now,
                 client=client_address(request), detail={"replacement": created.id})
    session.commit()
    ctx.auth.invalidate()
    return created


@router.get("/audit", response_model=list[audit.AuditOut], summary="The audit log, newest first")
def audit_log(session: Db, _: Admin, actor: str | None = None,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> list[audit.AuditOut]:
    return audit.list_audit(session=session, limit=limit, actor=actor)


@router.get("/alerts", response_model=list[AlertOut], dependencies=[Depends(require_reader)],
            summary="Alerts, newest first, each with the silences and inhibitions that mute it now")
def alerts(session: Db, ctx: Ctx, state: Annotated[str | None, Query(pattern="^(firing|resolved)$")] = None,
           silenced: bool | None = None, inhibited: bool | None = None,
           limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> list[AlertOut]:
    return list_alerts(session=session, now=ctx.clock(), stale_after=ctx.stale_after, state=state,
                       silenced=silenced, inhibited=inhibited, limit=limit)


@router.get("/alerts/{alert_id}", response_model=AlertDetailOut, dependencies=[Depends(require_reader)],
            summary="One alert with every notification that carried it, per receiver",
            responses={404: {"description": "no such alert"}})
def alert(alert_id: RowId, session: Db, ctx: Ctx) -> AlertDetailOut:
    found = get_alert(session=session, alert_id=alert_id, now=ctx.clock(), stale_after=ctx.stale_after)
    if found is None:
        raise HTTPException(404, f"no alert {alert_id}")
    return found


@router.post("/alerts/{alert_id}/resolve", response_model=AlertDetailOut,
             summary="Resolve a firing alert by hand (operator; audited); its receivers are told",
             responses={404: {"description": "no such alert"}, 409: {"description": "not firing"}})
def resolve_alert(alert_id: RowId, request: Request, ctx: Ctx, session: Db,
                  who: Annotated[Principal, Depends(require_operator)]) -> AlertDetailOut:
    now = ctx.clock()
    if get_alert(session=session, alert_id=alert_id, now=now, stale_after=ctx.stale_after) is None:
        raise HTTPException(404, f"no alert {alert_id}")
    if not resolve_by_hand(session=session, alert_id=alert_id, by=who.name, now=now):
        raise HTTPException(409, f"alert {alert_id} is not firing")
    audit.record(session=session, who=who, what="alert.resolve", target=f"alert:{alert_id}", now=now,
                 client=client_address(request))
    session.commit()
    found = get_alert(session=session, alert_id=alert_id, now=now, stale_after=ctx.stale_after)
    assert found is not None
    return found
