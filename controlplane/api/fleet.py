"""Read endpoints over the fleet: nodes, GPUs, replicas, events, and replica and GPU time series."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter

from agent.wire import MAX_GPU_INDEX, Moment
from controlplane.api.context import (
    Ctx,
    Db,
    require_reader,
)
from controlplane.fleet import queries, replica_table
from controlplane.fleet.schemas import (
    EventOut,
    GpuOut,
    NodeDetail,
    NodeOut,
    ReplicaOut,
    ReplicaSampleOut,
    ReplicaTable,
    SampleOut,
)

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


ReplicaMatch = Annotated[list[str] | None, Query(description="repeat it to match any of several")]
# Each view is serialized by its own type, the union declared only for the schema: through the union, pydantic
# tries both shapes on every row (a tenth of a second more at 8,000 replicas).
_FULL_VIEW = TypeAdapter(list[ReplicaOut])


@router.get("/replicas", response_model=list[ReplicaOut] | ReplicaTable,
            summary="Replicas, filtered by node, model or state; view=table: one sorted page of table rows, "
                    "the total and the filters' values")
def replicas(
    ctx: Ctx, session: Db, node: ReplicaMatch = None, model: ReplicaMatch = None, state: ReplicaMatch = None,
    view: Annotated[Literal["full", "table"], Query(
        description="full: every match as ReplicaOut; table: a page of lean rows with the total")] = "full",
    q: Annotated[str | None, Query(max_length=replica_table.MAX_TEXT,
                                   description="table: in node/name or the engine flags, any case")] = None,
    sort: Annotated[str | None, Query(pattern=replica_table.SORT_PATTERN,
                                      description="table: a column or reading, '-' first for descending")] = None,
    offset: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="table: rows skipped")] = None,
    limit: Annotated[int | None, Query(ge=1, le=replica_table.MAX_LIMIT,
                                       description=f"table: rows (default {replica_table.DEFAULT_LIMIT})")] = None,
) -> Response:
    if view == "table":
        page = replica_table.replica_table(
            session=session, now=ctx.clock(), stale_after=ctx.stale_after, node=node, model=model, state=state,
            text=q or "", sort=sort or "node", offset=offset or 0, limit=limit or replica_table.DEFAULT_LIMIT)
        return Response(page.model_dump_json(), media_type="application/json")
    # The full view is every match: a page of it would carry no total to say it is one.
    paging = {"q": q, "sort": sort, "offset": offset, "limit": limit}
    if given := {name: value for name, value in paging.items() if value is not None}:
        raise RequestValidationError([{"type": "value_error", "loc": ("query", name), "input": value,
                                       "msg": "only with view=table (the full view is every match)"}
                                      for name, value in given.items()])
    found = queries.list_replicas(session=session, now=ctx.clock(), stale_after=ctx.stale_after,
                                  node=node, model=model, state=state)
    return Response(_FULL_VIEW.dump_json(found), media_type="application/json")


@router.get("/replicas/{node}/{name}", response_model=ReplicaOut, summary="One replica")
def replica(node: str, name: str, ctx: Ctx, session: Db) -> ReplicaOut:
    found = queries.get_replica(session=session, now=ctx.clock(), stale_after=ctx.stale_after,
                                node=node, name=name)
    if found is None:
        raise HTTPException(404, f"no replica {name!r} on node {node!r}")
    return found


# The window and bound every time series is read with. ``since`` must carry its offset (a 422 otherwise): the
# store compares in UTC, and a naive time would be a guess that its UTC column refuses. Nothing is older than the
# epoch; a time before it is refused too (year 1 at +01:00 is before year 1 in UTC: no datetime holds it).
Since = Annotated[Moment | None, Query(description="oldest point returned, with its UTC offset, not before 1970")]
SampleLimit = Annotated[int, Query(ge=1, le=10_000, description="at most this many points: the newest")]


# A signal the agent did not report is left out of a point, as the store keeps it, not sent as null.
@router.get("/replicas/{node}/{name}/samples", response_model=list[ReplicaSampleOut], response_model_exclude_none=True,
            summary="A replica's time series (TTFT/ITL p50/p95/p99, queues, KV usage, RSS), oldest first")
def samples(node: str, name: str, session: Db, since: Since = None,
            limit: SampleLimit = 1000) -> list[ReplicaSampleOut]:
    return queries.replica_samples(session=session, node=node, name=name, since=since, limit=limit)


@router.get("/gpus/{node}/{index}/samples", response_model=list[SampleOut],
            responses={404: {"description": "no such node"}},
            summary="A GPU's time series (temperature, memory, utilisation, power, XIDs), oldest first")
def gpu_samples(
    node: str, index: Annotated[int, Path(ge=0, le=MAX_GPU_INDEX)], session: Db,
    since: Since = None, limit: SampleLimit = 1000,
) -> list[SampleOut]:
    found = queries.gpu_samples(session=session, node=node, index=index, since=since, limit=limit)
    if found is None:
        raise HTTPException(404, f"no node named {node!r}")
    return found


@router.get("/events", response_model=list[EventOut], summary="Recent replica events, newest first")
def events(
    ctx: Ctx, session: Db, node: str | None = None, replica: str | None = None,
    since: Since = None, limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
) -> list[EventOut]:
    return queries.list_events(session=session, limit=limit or ctx.config.events_limit,
                               node=node, replica=replica, since=since)
