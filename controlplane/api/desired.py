"""Operator endpoints over the desired-state table; agents read the result in the answer to their report."""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, HTTPException, Request

from agent.wire import NAME_PATTERN
from controlplane import audit
from controlplane.api.context import (
    Ctx,
    Db,
    Operator,
    client_address,
    require_reader,
)
from controlplane.fleet.desired import DesiredChange, DesiredOut, forget_node, list_desired, set_desired

router = APIRouter(prefix="/v1", tags=["desired state"])


@router.get("/desired", response_model=list[DesiredOut], dependencies=[Depends(require_reader)],
            summary="Desired replica specs, optionally for one node")
def desired(session: Db, node: str | None = None) -> list[DesiredOut]:
    return list_desired(session=session, node=node)


@router.put("/desired/{node}/{name}", response_model=DesiredOut,
            summary="Change one replica's engine args, restart it, or stop/start it (bypasses the guardrails: "
                    "prefer POST /v1/replicas/{node}/{name}/actions)")
def change(node: str, name: str, body: DesiredChange, request: Request, ctx: Ctx, session: Db,
           who: Operator) -> DesiredOut:
    if not (re.match(NAME_PATTERN, node) and re.match(NAME_PATTERN, name)):
        raise HTTPException(422, "node and replica names must match " + NAME_PATTERN)
    out = set_desired(session=session, node=node, name=name, change=body, now=ctx.clock())
    audit.record(session=session, who=who, what="desired.set", target=f"replica:{node}/{name}", now=ctx.clock(),
                 client=client_address(request), detail=body.model_dump(mode="json"))
    return out


@router.delete("/nodes/{node}", status_code=204,
               summary="Forget a decommissioned node (it reappears if its agent reports again)")
def forget(node: str, request: Request, ctx: Ctx, session: Db, who: Operator) -> None:
    if not forget_node(session=session, node=node):
        raise HTTPException(404, f"no node named {node!r}")
    audit.record(session=session, who=who, what="node.forget", target=f"node:{node}", now=ctx.clock(),
                 client=client_address(request))
