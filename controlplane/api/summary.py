"""``GET /v1/summary``: the fleet at a glance in one call, for the console's Fleet page and ``pitstop status``.

Per model its SLO status against the loaded policies' targets (``fleet.summary``), replicas by state and
throughput; the nodes by status; the alerts firing; whether automation runs (policies enabled, the breaker,
the policies in dry run or waiting for approval); and the last actions with their outcome.

It reads counts and a few columns, never the fleet's full rows: at thousands of replicas, building every
``ReplicaOut`` and ``NodeOut`` to count them and take a maximum cost a second per call.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel
from sqlalchemy import func, select

from controlplane.api.context import Ctx, Db, require_reader
from controlplane.fleet import queries
from controlplane.fleet.schemas import NodeStatus
from controlplane.fleet.summary import ModelSummary, summarise
from controlplane.jobs import Jobs
from controlplane.remediation import breaker
from controlplane.remediation.breaker import BreakerOut
from controlplane.store.models import ActionRow, AlertRow, Node

router = APIRouter(prefix="/v1", tags=["fleet"], dependencies=[Depends(require_reader)])


class NodesSummary(BaseModel):
    total: int
    up: int
    stale: int
    cordoned: int


class AutomationSummary(BaseModel):
    policies_enabled: bool
    breaker: BreakerOut
    policies: int
    dry_run: list[str]
    approval: list[str]


class RecentAction(BaseModel):
    id: int
    created_at: datetime
    kind: str
    target: str
    state: str
    requested_by: str
    outcome: str


class FleetSummary(BaseModel):
    generated_at: datetime
    models: list[ModelSummary]
    nodes: NodesSummary
    alerts_firing: int
    automation: AutomationSummary
    recent_actions: list[RecentAction]


@router.get("/summary", response_model=FleetSummary,
            summary="The fleet at a glance: per-model SLO status, nodes, alerts, automation, the last actions")
def fleet_summary(request: Request, ctx: Ctx, session: Db,
                  actions: Annotated[int, Query(ge=0, le=100)] = 10) -> FleetSummary:
    now = ctx.clock()
    jobs: Jobs = request.app.state.jobs
    jobs.policies.refresh(now)
    policies = jobs.policies.policies
    by_status = queries.count_nodes_by_status(session=session, now=now, stale_after=ctx.stale_after)
    cordoned = session.scalar(select(func.count()).select_from(Node).where(Node.cordoned)) or 0
    firing = session.scalar(select(func.count()).select_from(AlertRow).where(AlertRow.state == "firing")) or 0
    rows = session.scalars(select(ActionRow).order_by(ActionRow.id.desc()).limit(actions))
    return FleetSummary(
        generated_at=now,
        models=summarise(queries.replica_figures(session=session, now=now, stale_after=ctx.stale_after), policies),
        nodes=NodesSummary(total=sum(by_status.values()), up=by_status[NodeStatus.UP],
                           stale=by_status[NodeStatus.STALE], cordoned=int(cordoned)),
        alerts_firing=int(firing),
        automation=AutomationSummary(
            policies_enabled=ctx.config.policies_enabled, breaker=breaker.read(session=session),
            policies=len(policies), dry_run=sorted(p.name for p in policies if p.enabled and p.guardrails.dry_run),
            approval=sorted(p.name for p in policies if p.enabled and p.guardrails.require_approval)),
        recent_actions=[RecentAction(id=r.id, created_at=r.created_at, kind=r.kind, target=r.target, state=r.state,
                                     requested_by=r.requested_by, outcome=r.outcome) for r in rows],
    )
