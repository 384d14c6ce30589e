"""Read endpoints over the fleet: nodes, GPUs, replicas, events and replica time series."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from controlplane.api.context import (
    Ctx,
    Db,
    require_reader,
)
from controlplane.fleet import queries
from controlplane.fleet.schemas import EventOut, GpuOut, NodeDetail, NodeOut, ReplicaOut, SampleOut

router = APIRouter(prefix="/v1", tags=["fleet"], dependencies=[Depends(require_reader)])


@router.get("/nodes", response_model=list[NodeOut], summary="All nodes, with status and last report age")
def nodes(ctx: Ctx, session: Db) -> list[NodeOut]:
    return queries.list_nodes(session=session, now=ctx.clock(), stale_after=ctx.stale_after)


@router.get("/nodes/{node}", response_model=NodeDetail, summary="One node with its GPUs and replicas")
def node(node: str, ctx: Ctx, session: Db) -> NodeDetail:
    found = queries.get_node(session=session, now=ctx.clock(), stale_after=ctx.stale_after, name=node)
    if found is None:
        raise HTTPException(404, f"no node named {node!r}")
    return found


@router.get("/gpus", response_model=list[GpuOut], summary="Latest readings of every GPU")
def gpus(ctx: Ctx, session: Db, node: str | None = None) -> list[GpuOut]:
    return queries.list_gpus(session=session, now=ctx.clock(), stale_after=ctx.stale_after, node=node)


@router.get("/replicas", response_model=list[ReplicaOut], summary="Replicas, filtered by node, model or state")
def replicas(
    ctx: Ctx, session: Db, node: str | None = None, model: str | None = None, state: str | None = None
) -> list[ReplicaOut]:
    return queries.list_replicas(session=session, now=ctx.clock(), stale_after=ctx.stale_after,
                                 node=node, model=model, state=state)


@router.get("/replicas/{node}/{name}", response_model=ReplicaOut, summary="One replica")
def replica(node: str, name: str, ctx: Ctx, session: Db) -> ReplicaOut:
    found = queries.get_replica(session=session, now=ctx.clock(), stale_after=ctx.stale_after,
                                node=node, name=name)
    if found is None:
        raise HTTPException(404, f"no replica {name!r} on node {node!r}")
    return found


@router.get("/replicas/{node}/{name}/samples", response_model=list[SampleOut],
            summary="A replica's time series (TTFT/ITL p99, queues, KV usage, RSS), oldest first")
def samples(
    node: str, name: str, session: Db,
    since: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[SampleOut]:
    return queries.replica_samples(session=session, node=node, name=name, since=since, limit=limit)


@router.get("/events", response_model=list[EventOut], summary="Recent replica events, newest first")
def events(
    ctx: Ctx, session: Db, node: str | None = None, replica: str | None = None,
    since: datetime | None = None, limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
) -> list[EventOut]:
    return queries.list_events(session=session, limit=limit or ctx.config.events_limit,
                               node=node, replica=replica, since=since)
