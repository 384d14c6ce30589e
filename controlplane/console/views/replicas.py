"""Replicas: a page of the fleet's replicas, filtered, sorted and paged by the control plane; the one chosen with
its charts, timeline and logs.

One read gives the page, how many match and the values to filter by (``view=table``); the chosen replica is
read whole on its own. The widgets' values are read from the session before the widgets are drawn: the
filters' choices come from the very answer they ask for.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from controlplane.console import charts, confirm, frame, palette, replica_view, shaping
from controlplane.console.previews import Request
from controlplane.console.reads import Reader
from controlplane.console.shaping import Json

# The filters' keys in the session, by the facet each picks from.
FILTERS = {"model": "filter_model", "node": "filter_node", "state": "filter_state"}
PAGE_KEY = "table_page"


def _query() -> dict[str, Any]:
    """This run's page request, from the widgets' values as the session holds them."""
    chosen = st.session_state
    return replica_view.table_query(
        models=chosen.get(FILTERS["model"]) or (), nodes=chosen.get(FILTERS["node"]) or (),
        states=chosen.get(FILTERS["state"]) or (), text=chosen.get("filter_text") or "",
        sort=chosen.get("table_sort") or "", page=int(chosen.get(PAGE_KEY) or 1))


def _first_page() -> None:
    """A new filter or order starts at its first page."""
    st.session_state[PAGE_KEY] = 1


def _filters(facets: Json) -> None:
    *columns, text, order = st.columns(5)
    for column, (facet, key) in zip(columns, FILTERS.items(), strict=True):
        column.multiselect(facet, replica_view.options(facets.get(facet) or {}, st.session_state.get(key) or ()),
                           key=key, on_change=_first_page)
    text.text_input("name or flag contains", key="filter_text", on_change=_first_page)
    order.selectbox("sort by", list(replica_view.SORTS), key="table_sort", on_change=_first_page)


def _actions(console: frame.Console, r: Json) -> None:
    path = f"/v1/replicas/{r['node']}/{r['name']}/actions"
    left, right = st.columns(2)
    with left:
        confirm.action(console, Request(key=f"restart:{replica_view.key(r)}", label="Restart", method="POST",
                                        path=path, body={"kind": "restart", "reason": "restarted from the console"},
                                        previewable=True))
    with right:
        confirm.action(console, Request(key=f"drain:{replica_view.key(r)}", label="Drain", method="POST", path=path,
                                        body={"kind": "drain", "reason": "drained from the console"},
                                        previewable=True))


def _draw(where: DeltaGenerator, chart: replica_view.Chart) -> None:
    where.caption(chart.title)
    if not chart.points:
        where.caption(chart.empty)
        return
    if chart.limit is not None or chart.projection:
        where.altair_chart(charts.lines_to_limit(chart.points, chart.unit, chart.limit, chart.limit_label,
                                                 projection=chart.projection), width="stretch")
    else:
        scale = palette.quantile_scale() if chart.quantiles else None
        where.altair_chart(charts.lines(chart.points, chart.unit, scale=scale), width="stretch")
    if chart.note:
        where.caption(chart.note)


def _charts(reader: Reader, r: Json) -> None:
    window = st.segmented_control("window", list(replica_view.WINDOWS), default="1 h", key="chart_window") or "1 h"
    # The window ends at the replica's last report: a node that went quiet still shows its last hour.
    since = (datetime.fromisoformat(r["updated_at"]) - timedelta(seconds=replica_view.WINDOWS[window])).isoformat()
    samples = reader.get(f"/v1/replicas/{r['node']}/{r['name']}/samples", since=since,
                         limit=replica_view.CHART_POINTS)
    # Only the chosen replica's node: the host's memory (RSS's limit) and its GPUs' latest readings (their
    # memory, the tiles, the slowdown thresholds); the whole fleet's GPUs would be thousands of rows for a few.
    node = reader.get(f"/v1/nodes/{r['node']}")
    latest = {g["index"]: g for g in node["gpus"]}
    shown: list[replica_view.Chart] = []
    if len(samples) < 2:
        st.caption("Not enough samples of this replica for a chart yet.")
    else:
        shown += replica_view.replica_charts(samples, host_memory=node.get("memory_total_bytes"),
                                             gpus=[latest.get(i) for i in r.get("gpus") or []])
    for index in r.get("gpus") or []:
        history = reader.get(f"/v1/gpus/{r['node']}/{index}/samples", since=since, limit=replica_view.CHART_POINTS)
        shown.append(replica_view.temperature_chart(index, history, latest.get(index)))
    if not r.get("gpus"):
        st.caption("This replica lists no GPU: no temperature to chart.")
    # Two to a row, so each row's charts line up whatever the captions' lengths.
    for start in range(0, len(shown), 2):
        for where, chart in zip(st.columns(2), shown[start:start + 2], strict=False):
            _draw(where, chart)
    for index in r.get("gpus") or []:
        if (g := latest.get(index)) is not None:
            temp, slowdown = g.get("temperature_celsius"), g.get("slowdown_temperature_celsius")
            st.metric(f"GPU {index} temperature", "-" if temp is None else f"{temp:g} °C",
                      help=None if slowdown is None else f"slows down at {slowdown:g} °C")


def _history(reader: Reader, r: Json) -> None:
    events = reader.get("/v1/events", node=r["node"], replica=r["name"], limit=500)
    rows = replica_view.timeline_rows(events)
    st.markdown("**State timeline**")
    if any(row["state"] for row in rows):
        st.altair_chart(charts.timeline(rows), width="stretch")
    frame.table([{**row, "at": row["at"]} for row in reversed(rows)], "No events recorded for this replica.")
    tail = "\n".join(r.get("log_tail") or [])
    with st.expander("log tail", expanded=bool(tail)):
        st.code(tail or "(no log lines reported)", language=None)
    dump = replica_view.last_stack_dump(events)
    with st.expander("last stack dump", expanded=False):
        st.code(dump[1] if dump else "(no stack dump recorded: one is taken before each restart)", language=None)


def render(console: frame.Console, reader: Reader) -> None:
    table = reader.get("/v1/replicas", **_query())
    facets: Json = table["facets"]
    if not facets["state"]:
        st.caption("No replicas reported.")
        return
    if not table["replicas"] and table["total"]:
        # Past the last page (the fleet shrank under it): the last page instead.
        st.session_state[PAGE_KEY] = replica_view.pages(table["total"])
        table = reader.get("/v1/replicas", **_query())
    # Named wherever they are in the fleet, not only on this page; read only when the fleet has any.
    troubled = tuple(s for s in replica_view.ATTENTION_STATES if s in facets["state"])
    trouble = (reader.get("/v1/replicas", view="table", state=troubled, limit=replica_view.ATTENTION_ROWS)
               if troubled else None)
    for line in replica_view.attention_lines(trouble, table["replicas"]):
        st.warning(line)
    _filters(facets)
    rows = replica_view.table_rows(table["replicas"])
    st.caption(replica_view.showing(table))
    frame.table(rows, "No replica matches these filters.")
    if table["total"] > replica_view.PAGE_ROWS:
        # A fixed label (the caption says of how many): a label that changed with the fleet would reset the page.
        st.number_input("page", min_value=1, step=1, key=PAGE_KEY)
    if not rows:
        return
    keys = [str(row["replica"]) for row in rows]
    # Nothing chosen at first: the table is what the page is opened for, and one replica's page (five reads,
    # seven charts) would hold it back from being usable for as long as it takes on a big fleet.
    chosen = st.selectbox("replica", keys, index=None, key="chart_replica",
                          placeholder="choose a replica: its charts, state timeline, log tail and stack dump")
    if chosen is None:
        return
    picked = next(x for x in table["replicas"] if replica_view.key(x) == chosen)
    r = reader.get(f"/v1/replicas/{picked['node']}/{picked['name']}")
    st.subheader(chosen)
    facts = shaping.replica_detail(r)
    facts.pop("log tail")
    st.dataframe(pd.DataFrame([facts]), hide_index=True, width="stretch")
    _actions(console, r)
    _charts(reader, r)
    _history(reader, r)


frame.page("Replicas", render)
