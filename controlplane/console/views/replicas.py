"""Replicas: every replica in a sortable, filterable table; the one chosen with its charts, timeline and logs."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
import streamlit as st

from controlplane.console import charts, confirm, frame, replica_view, shaping
from controlplane.console.previews import Request
from controlplane.console.reads import Reader
from controlplane.console.shaping import Json


def _filters(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    left, mid, right, text = st.columns(4)
    models = left.multiselect("model", sorted({str(r["model"]) for r in rows}), key="filter_model")
    nodes = mid.multiselect("node", sorted({str(r["node"]) for r in rows}), key="filter_node")
    states = right.multiselect("state", sorted({str(r["state"]).split(" ")[0] for r in rows}), key="filter_state")
    needle = text.text_input("name or flag contains", key="filter_text")
    return replica_view.filter_rows(rows, models=models, nodes=nodes, states=states, text=needle)


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


def _charts(reader: Reader, r: Json) -> None:
    window = st.segmented_control("window", list(replica_view.WINDOWS), default="1 h", key="chart_window") or "1 h"
    # The window ends at the replica's last report: a node that went quiet still shows its last hour.
    since = datetime.fromisoformat(r["updated_at"]) - timedelta(seconds=replica_view.WINDOWS[window])
    samples = reader.get(f"/v1/replicas/{r['node']}/{r['name']}/samples", since=since.isoformat(), limit=2000)
    if len(samples) < 2:
        st.caption("Not enough samples for a chart yet.")
    else:
        left, right = st.columns(2)
        left.caption("Latency p99 (ms)")
        left.altair_chart(charts.lines(replica_view.long_series(samples, replica_view.LATENCY, 1000), "ms"),
                          width="stretch")
        right.caption("Tokens generated per second")
        right.altair_chart(charts.lines(replica_view.long_series(
            samples, (("generation_tokens_per_second", "tokens/s"),)), "tokens/s"), width="stretch")
        left.caption("Queue (requests)")
        left.altair_chart(charts.lines(replica_view.long_series(samples, replica_view.QUEUE), "requests"),
                          width="stretch")
        right.caption("Memory (MiB): the process tree's RSS, and its GPU memory")
        right.altair_chart(charts.lines(replica_view.long_series(samples, replica_view.MEMORY, 1 / shaping.MIB),
                                        "MiB"), width="stretch")
    # Only the chosen replica's node: the whole fleet's GPUs would be thousands of rows to read for two tiles.
    for g in reader.get("/v1/gpus", node=r["node"]):
        if g["index"] in (r.get("gpus") or []):
            temp, slowdown = g.get("temperature_celsius"), g.get("slowdown_temperature_celsius")
            st.metric(f"GPU {g['index']} temperature", "-" if temp is None else f"{temp:g} °C",
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
    replicas = reader.get("/v1/replicas")
    for line in shaping.attention([], replicas, []):
        st.warning(line)
    rows = replica_view.table_rows(replicas)
    if not rows:
        st.caption("No replicas reported.")
        return
    shown = _filters(rows)
    frame.table(shown, "No replica matches these filters.")
    keys = [str(row["replica"]) for row in shown] or [str(row["replica"]) for row in rows]
    chosen = st.selectbox("replica", keys, key="chart_replica") or keys[0]
    r = next(x for x in replicas if replica_view.key(x) == chosen)
    st.subheader(chosen)
    facts = shaping.replica_detail(r)
    facts.pop("log tail")
    st.dataframe(pd.DataFrame([facts]), hide_index=True, width="stretch")
    _actions(console, r)
    _charts(reader, r)
    _history(reader, r)


frame.page("Replicas", render)
