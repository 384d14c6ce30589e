"""Operator endpoints over the desired-state table; agents read the result in the answer to their report."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request
from sqlalchemy.orm import Session

from agent.wire import NAME_PATTERN
from controlplane.api.context import AppContext, get_context, get_session, require_reader
from controlplane.fleet.desired import DesiredChange, DesiredOut, forget_node, list_desired, set_desired

router = APIRouter(prefix="/v1", tags=["desired state"])

Ctx = Annotated[AppContext, Depends(get_context)]
Db = Annotated[Session, Depends(get_session)]


def require_operator(request: Request) -> None:
    get_context(request).operator_auth.require(request)


@router.get("/desired", response_model=list[DesiredOut], dependencies=[Depends(require_reader)],
            summary="Desired replica specs, optionally for one node")
def desired(session: Db, node: str | None = None) -> list[DesiredOut]:
    return list_desired(session=session, node=node)


@router.put("/desired/{node}/{name}", response_model=DesiredOut, dependencies=[Depends(require_operator)],
            summary="Change one replica's engine args, restart it, or stop/start it")
def change(node: str, name: str, body: DesiredChange, ctx: Ctx, session: Db) -> DesiredOut:
    if not (re.match(NAME_PATTERN, node) and re.match(NAME_PATTERN, name)):
        raise HTTPException(422, "node and replica names must match " + NAME_PATTERN)
    return set_desired(session=session, node=node, name=name, change=body, now=ctx.clock())


@router.delete("/nodes/{node}", status_code=204, dependencies=[Depends(require_operator)],
               summary="Forget a decommissioned node (it reappears if its agent reports again)")
def forget(node: str, session: Db) -> None:
    if not forget_node(session=session, node=node):
        raise HTTPException(404, f"no node named {node!r}")
