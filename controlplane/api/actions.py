"""Operator actions: act on a replica, a node or a model, list and get actions, approve or reject proposed ones.

Every request becomes an action record through the guardrails (``remediation.operator``); an approved one is
applied at once by the executor (the leader's executor job would pick it up otherwise), and every write here
is audited in its own transaction.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from controlplane import audit
from controlplane.api.context import (
    AppContext,
    Ctx,
    Db,
    Operator,
    RowId,
    client_address,
    require_reader,
)
from controlplane.policy.guardrails import GuardConfig
from controlplane.policy.kinds import spec
from controlplane.policy.lifecycle import ActionState
from controlplane.remediation import operator, records
from controlplane.remediation.executor import apply_action
from controlplane.remediation.operator import (
    Conflict,
    ModelActionRequest,
    NodeActionRequest,
    NotFound,
    ReplicaActionRequest,
)
from controlplane.remediation.preview import ActionPreview
from controlplane.remediation.records import ActionOut, AnyActionOut
from controlplane.security.roles import Principal, Role, role_allows
from controlplane.store.db import session_scope
from controlplane.store.models import ActionRow

router = APIRouter(prefix="/v1", tags=["actions"])

StateFilter = Annotated[ActionState | None, Query()]
# ``?dry_run=true``: what the guardrails would decide now and the blast radius, as a 200; nothing is recorded.
DryRun = Annotated[bool, Query(description="preview the guardrails' decision and blast radius; record nothing")]
_ACT_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"model": ActionPreview, "description": "dry run: the decision and blast radius, nothing recorded"},
    403: {"description": "role too low, or force without admin"},
}


def _check_force(who: Principal, force: bool) -> None:
    if force and not who.anonymous and who.role is not Role.ADMIN:
        raise HTTPException(403, "force bypasses the guardrails and needs an admin token")


def _check_kind(who: Principal, kind: str) -> None:
    """The table of kinds says which role may ask for each kind (none: only the policies propose it)."""
    needed = spec(kind).operator_role
    if needed is None:
        raise HTTPException(403, f"{kind} is proposed by the policies only")
    if not who.anonymous and not role_allows(who.role, needed):
        raise HTTPException(403, f"{kind} needs the {needed.value} role")


def _apply_now(ctx: AppContext, action_id: int) -> AnyActionOut | None:
    with session_scope(ctx.sessions) as session:
        apply_action(session=session, action_id=action_id, now=ctx.clock())
        return records.get_action(session=session, action_id=action_id)


async def _finish(ctx: AppContext, row: ActionRow, request: Request, who: Principal, force: bool) -> AnyActionOut:
    with session_scope(ctx.sessions) as session:
        audit.record(session=session, who=who, what=f"action.{row.kind}", target=row.target, now=ctx.clock(),
                     client=client_address(request),
                     detail={"action_id": row.id, "state": row.state, "force": force})
    out = await run_in_threadpool(_apply_now, ctx, row.id) if row.state == ActionState.APPROVED else None
    return out or records.action_out(row)


def _guard_config(ctx: AppContext) -> GuardConfig:
    """The server's configured guardrails: an operator's request is judged by the same ones as a policy's."""
    return ctx.config.guard_config()


async def _act(ctx: AppContext, request: Request, who: Principal, kind: str, force: bool, dry_run: bool,
               act: operator.Act) -> AnyActionOut | JSONResponse:
    _check_kind(who, kind)
    _check_force(who, force)

    def run() -> ActionRow | ActionPreview:
        with session_scope(ctx.sessions) as session:
            return act(session, ctx.clock(), _guard_config(ctx), dry_run)
    try:
        got = await run_in_threadpool(run)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from exc
    if isinstance(got, ActionPreview):
        return JSONResponse(got.model_dump(mode="json"), status_code=200)
    return await _finish(ctx, got, request, who, force)


@router.post("/replicas/{node}/{name}/actions", response_model=ActionOut, status_code=201,
             summary="Restart, drain or set engine flags of one replica (through the guardrails)",
             responses={**_ACT_RESPONSES, 404: {"description": "no such replica"}})
async def act_on_replica(node: str, name: str, body: ReplicaActionRequest, request: Request, ctx: Ctx,
                         who: Operator, dry_run: DryRun = False) -> AnyActionOut | JSONResponse:
    return await _act(ctx, request, who, body.kind, body.force, dry_run, lambda session, now, config, dry: (
        operator.act_on_replica(session=session, node=node, name=name, request=body, who=who.name, now=now,
                                config=config, dry_run=dry)))


@router.post("/nodes/{node}/actions", response_model=ActionOut, status_code=201,
             summary="Cordon or uncordon a node, or one of its GPUs with `gpu` (through the guardrails)",
             responses={**_ACT_RESPONSES, 404: {"description": "no such node"}})
async def act_on_node(node: str, body: NodeActionRequest, request: Request, ctx: Ctx, who: Operator,
                      dry_run: DryRun = False) -> AnyActionOut | JSONResponse:
    return await _act(ctx, request, who, body.kind, body.force, dry_run, lambda session, now, config, dry: (
        operator.act_on_node(session=session, node=node, request=body, who=who.name, now=now, config=config,
                             dry_run=dry)))


# ``model:path``: served model names are often a hub path ("meta-llama/Llama-3.1-8B-Instruct"), slash and all.
@router.post("/models/{model:path}/actions", response_model=ActionOut, status_code=201,
             summary="Rolling restart of a model's managed replicas, or a change of its engines' running limit "
                     "(--max-num-seqs, --max-running-requests) tried on a canary first (through the guardrails)",
             responses={**_ACT_RESPONSES, 404: {"description": "no managed replica of that model"},
                        409: {"description": "a rolling restart of the model is already open"}})
async def act_on_model(model: str, body: ModelActionRequest, request: Request, ctx: Ctx, who: Operator,
                       dry_run: DryRun = False) -> AnyActionOut | JSONResponse:
    return await _act(ctx, request, who, body.checked_kind, body.force, dry_run, lambda session, now, config, dry: (
        operator.act_on_model(session=session, model=model, request=body, who=who.name, now=now, config=config,
                              dry_run=dry)))


@router.get("/actions", response_model=list[ActionOut], dependencies=[Depends(require_reader)],
            summary="Actions, newest first, filtered by state, target key or policy")
def list_actions(session: Db, state: StateFilter = None, target: str | None = None, policy: str | None = None,
                 limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> list[AnyActionOut]:
    return records.list_actions(session=session, state=state, target=target, policy=policy, limit=limit)


@router.get("/actions/{action_id}", response_model=ActionOut, dependencies=[Depends(require_reader)],
            summary="One action with its evidence and guardrail decisions")
def get_action(action_id: RowId, session: Db) -> AnyActionOut:
    found = records.get_action(session=session, action_id=action_id)
    if found is None:
        raise HTTPException(404, f"no action {action_id}")
    return found


def _decide(ctx: AppContext, action_id: int, request: Request, who: Principal, approve: bool) -> AnyActionOut:
    with session_scope(ctx.sessions) as session:
        now = ctx.clock()
        if records.get_action(session=session, action_id=action_id) is None:
            raise HTTPException(404, f"no action {action_id}")
        moved = (records.approve if approve else records.reject)(session=session, action_id=action_id,
                                                                   by=who.name, now=now)
        if not moved:
            raise HTTPException(409, f"action {action_id} is not proposed")
        audit.record(session=session, who=who, what="action.approve" if approve else "action.reject",
                     target=f"action:{action_id}", now=now, client=client_address(request))
    out = _apply_now(ctx, action_id) if approve else None
    with session_scope(ctx.sessions) as session:
        found = out or records.get_action(session=session, action_id=action_id)
    assert found is not None
    return found


@router.post("/actions/{action_id}/approve", response_model=ActionOut, summary="Approve a proposed action",
             responses={404: {"description": "no such action"}, 409: {"description": "not proposed"}})
def approve(action_id: RowId, request: Request, ctx: Ctx, who: Operator) -> AnyActionOut:
    return _decide(ctx, action_id, request, who, approve=True)


@router.post("/actions/{action_id}/reject", response_model=ActionOut, summary="Reject a proposed action",
             responses={404: {"description": "no such action"}, 409: {"description": "not proposed"}})
def reject(action_id: RowId, request: Request, ctx: Ctx, who: Operator) -> AnyActionOut:
    return _decide(ctx, action_id, request, who, approve=False)
