"""Remediation endpoints: the loaded policies and their errors, a live dry run, and the circuit breaker."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from controlplane import audit
from controlplane.api.context import (
    Ctx,
    Db,
    client_address,
    require_operator,
    require_reader,
)
from controlplane.jobs import Jobs
from controlplane.policy.explain import ExplainReport, explain
from controlplane.remediation import breaker
from controlplane.remediation.alerting import resolve_breaker_page
from controlplane.remediation.breaker import BreakerOut
from controlplane.remediation.records import guard_state
from controlplane.remediation.snapshot import build_snapshot
from controlplane.security.roles import Principal

router = APIRouter(prefix="/v1", tags=["remediation"])


class PolicyErrorOut(BaseModel):
    file: str
    line: int
    field: str
    message: str


class PoliciesOut(BaseModel):
    loaded_at: datetime | None
    sources: list[str]
    files: list[str]
    enabled: bool
    policies: list[dict[str, Any]]
    errors: list[PolicyErrorOut]


def _jobs(request: Request) -> Jobs:
    jobs: Jobs = request.app.state.jobs
    return jobs


@router.get("/policies", response_model=PoliciesOut, dependencies=[Depends(require_reader)],
            summary="The policies the leader runs, and the errors of files that did not load")
def list_policies(request: Request, ctx: Ctx) -> PoliciesOut:
    policy_set = _jobs(request).policies
    policy_set.refresh(ctx.clock())
    return PoliciesOut(
        loaded_at=policy_set.loaded_at, sources=[str(s) for s in policy_set.sources], files=policy_set.files,
        enabled=ctx.config.policies_enabled,
        policies=[p.model_dump(mode="json", by_alias=True) for p in policy_set.policies],
        errors=[PolicyErrorOut(file=e.file, line=e.line, field=e.field, message=e.message)
                for e in policy_set.errors])


@router.get("/policies/explain", response_model=ExplainReport, dependencies=[Depends(require_reader)],
            summary="What each policy would do now on the live fleet, with the guardrails' decisions (dry run)")
def explain_policies(request: Request, ctx: Ctx, session: Db) -> ExplainReport:
    jobs = _jobs(request)
    now = ctx.clock()
    jobs.policies.refresh(now)
    snapshot = build_snapshot(session=session, now=now,
                              history=timedelta(seconds=ctx.config.policy_history_seconds))
    window = timedelta(seconds=max(3600.0, jobs.guard_config.breaker_window, jobs.guard_config.rate_window))
    state = breaker.with_breaker(guard_state(session=session, now=now, window=window),
                                 breaker.read(session=session))
    return explain(jobs.policies.policies, snapshot, state, now, jobs.guard_config)


@router.get("/remediation/breaker", response_model=BreakerOut, dependencies=[Depends(require_reader)],
            summary="The circuit breaker: tripped (automation stopped) or closed")
def get_breaker(session: Db) -> BreakerOut:
    return breaker.read(session=session)


@router.post("/remediation/breaker/reset", response_model=BreakerOut,
             summary="Reset the circuit breaker: automation resumes (operator; audited)")
def reset_breaker(request: Request, ctx: Ctx, session: Db,
                  who: Annotated[Principal, Depends(require_operator)]) -> BreakerOut:
    now = ctx.clock()
    before = breaker.read(session=session)
    out = breaker.reset(session=session, by=who.name, now=now)
    resolve_breaker_page(session=session, now=now, by=who.name)
    audit.record(session=session, who=who, what="breaker.reset", target="fleet", now=now,
                 client=client_address(request),
                 detail={"was_tripped": before.tripped, "reason": before.reason})
    return out
