"""Silences: an operator mutes the alerts some matchers match over a window (Alertmanager's silences).

Creating and expiring are operators' writes, audited; reading is a viewer's. A silence is never deleted:
``DELETE`` expires it now and the row stays, so the record says who silenced what, why, and until when.
``created_by`` is the token's name, never something the client says. Which alerts a silence mutes is the
notifier's business (``notify.silencing``); ``GET /v1/alerts`` shows it per alert as ``silenced_by``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import Select, select

from controlplane import audit
from controlplane.api.context import (
    Ctx,
    Db,
    Operator,
    RowId,
    client_address,
    require_reader,
)
from controlplane.notify.silencing import MAX_LENGTH, MAX_MATCHERS, RECENT, SilenceState, parse_matchers, silence_state
from controlplane.policy.durations import format_duration, parse_duration
from controlplane.store.models import SilenceRow

router = APIRouter(prefix="/v1", tags=["silences"])


class SilenceRequest(BaseModel):
    """A new silence: ``ends_at`` or ``duration`` (from ``starts_at``, which defaults to now)."""

    model_config = ConfigDict(extra="forbid")

    matchers: list[Annotated[str, Field(max_length=1024)]] = Field(
        min_length=1, max_length=MAX_MATCHERS, examples=[['alertname="pitstop-stall"', 'node="gpu-a"']])
    starts_at: AwareDatetime | None = None
    ends_at: AwareDatetime | None = None
    duration: str | None = Field(default=None, max_length=64, examples=["2h"])
    comment: str = Field(min_length=1, max_length=4096)

    @model_validator(mode="before")
    @classmethod
    def _no_author(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("created_by" in data or "createdBy" in data):
            raise ValueError("created_by is the name of the token that creates the silence: leave it out")
        return data

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, value: list[str]) -> list[str]:
        return [str(m) for m in parse_matchers(value)]  # ValueError names each bad matcher

    @field_validator("comment")
    @classmethod
    def _comment(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("say why: the comment is what on-call reads when the alert stays quiet")
        return value.strip()

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None and parse_duration(value) <= 0:
            raise ValueError("a silence lasts more than 0s")
        return value

    @model_validator(mode="after")
    def _one_end(self) -> SilenceRequest:
        if (self.ends_at is None) == (self.duration is None):
            raise ValueError("give either ends_at or duration (e.g. \"2h\")")
        return self

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        """When it applies; it never starts in the past (what was sent is sent). Raises ValueError."""
        starts = now if self.starts_at is None or self.starts_at < now else self.starts_at
        if starts - now > MAX_LENGTH:
            raise ValueError(f"a silence starts within {MAX_LENGTH.days} days")
        if self.duration is not None:
            seconds = parse_duration(self.duration)
            if seconds > MAX_LENGTH.total_seconds():
                raise ValueError(f"a silence lasts at most {MAX_LENGTH.days} days; change the policy instead")
            ends = starts + timedelta(seconds=seconds)
        else:
            assert self.ends_at is not None
            ends = self.ends_at
        if ends <= starts:
            raise ValueError("ends_at must be after starts_at and after now")
        if ends - starts > MAX_LENGTH:
            raise ValueError(f"a silence lasts at most {MAX_LENGTH.days} days; change the policy instead")
        return starts, ends


class SilenceOut(BaseModel):
    id: int
    matchers: list[str]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    state: SilenceState
    # When it stopped applying: ends_at once past (moved to the moment it was expired by hand).
    expired_at: datetime | None = None
    expired_by: str | None = None


def _out(row: SilenceRow, now: datetime) -> SilenceOut:
    state = silence_state(row.starts_at, row.ends_at, now)
    return SilenceOut(id=row.id, matchers=[str(m) for m in row.matchers], starts_at=row.starts_at,
                      ends_at=row.ends_at, created_by=row.created_by, comment=row.comment, created_at=row.created_at,
                      state=state, expired_at=row.expired_at or (row.ends_at if state == "expired" else None),
                      expired_by=row.expired_by)


def _in_state(query: Select[SilenceRow], state: SilenceState | None, now: datetime) -> Select[SilenceRow]:
    if state == "active":
        return query.where(SilenceRow.starts_at <= now, SilenceRow.ends_at > now)
    if state == "pending":
        return query.where(SilenceRow.starts_at > now, SilenceRow.ends_at > now)
    if state == "expired":
        return query.where(SilenceRow.ends_at <= now)
    return query.where(SilenceRow.ends_at > now - RECENT)


@router.post("/silences", response_model=SilenceOut, status_code=201,
             summary="Silence the alerts some matchers match, until ends_at or for a duration (operator; audited)",
             responses={422: {"description": "a bad matcher (named), no comment, or a window that is over"}})
def create_silence(body: SilenceRequest, request: Request, ctx: Ctx, session: Db, who: Operator) -> SilenceOut:
    now = ctx.clock()
    try:
        starts, ends = body.window(now)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    row = SilenceRow(matchers=body.matchers, starts_at=starts, ends_at=ends, created_by=who.name,
                     comment=body.comment, created_at=now)
    session.add(row)
    session.flush()
    audit.record(session=session, who=who, what="silence.create", target=f"silence:{row.id}", now=now,
                 client=client_address(request),
                 detail={"matchers": body.matchers, "starts_at": starts.isoformat(), "ends_at": ends.isoformat(),
                         "length": format_duration((ends - starts).total_seconds()), "comment": body.comment})
    session.commit()
    return _out(row, now)


@router.get("/silences", response_model=list[SilenceOut], dependencies=[Depends(require_reader)],
            summary="Silences, newest first: pending, active and those expired in the last 120 h, or one state")
def list_silences(ctx: Ctx, session: Db, state: SilenceState | None = None,
                  limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> list[SilenceOut]:
    now = ctx.clock()
    query = _in_state(select(SilenceRow), state, now)
    query = query.order_by(SilenceRow.created_at.desc(), SilenceRow.id.desc()).limit(limit)
    return [_out(row, now) for row in session.scalars(query)]


@router.get("/silences/{silence_id}", response_model=SilenceOut, dependencies=[Depends(require_reader)],
            summary="One silence", responses={404: {"description": "no such silence"}})
def get_silence(silence_id: RowId, ctx: Ctx, session: Db) -> SilenceOut:
    row = session.get(SilenceRow, silence_id)
    if row is None:
        raise HTTPException(404, f"no silence {silence_id}")
    return _out(row, ctx.clock())


@router.delete("/silences/{silence_id}", response_model=SilenceOut,
               summary="Expire a silence now; the row is kept (operator; audited)",
               responses={404: {"description": "no such silence"}, 409: {"description": "already expired"}})
def expire_silence(silence_id: RowId, request: Request, ctx: Ctx, session: Db, who: Operator) -> SilenceOut:
    now = ctx.clock()
    row = session.get(SilenceRow, silence_id, with_for_update=True)
    if row is None:
        raise HTTPException(404, f"no silence {silence_id}")
    was = silence_state(row.starts_at, row.ends_at, now)
    if was == "expired":
        raise HTTPException(409, f"silence {silence_id} has already expired")
    detail = {"was": was, "ends_at_was": row.ends_at.isoformat()}
    # It stops applying now; a pending one never started (Alertmanager does the same).
    row.ends_at, row.expired_at, row.expired_by = now, now, who.name
    if row.starts_at > now:
        row.starts_at = now
    audit.record(session=session, who=who, what="silence.expire", target=f"silence:{silence_id}", now=now,
                 client=client_address(request), detail=detail)
    session.commit()
    return _out(row, now)
