"""Nodes & GPUs: every GPU as a tile coloured against its own limits, the cordons, each agent's last report."""

from __future__ import annotations

import streamlit as st

from controlplane.console import confirm, frame, shaping, tiles
from controlplane.console.previews import Request
from controlplane.console.reads import Reader

TILES_PER_ROW = 4


def _cordon(console: frame.Console, node: str, cordoned: bool, gpu: int | None = None) -> None:
    kind = "uncordon" if cordoned else "cordon"
    what = f"GPU {gpu} of {node}" if gpu is not None else f"node {node}"
    body: dict[str, object] = {"kind": kind} if gpu is None else {"kind": kind, "gpu": gpu}
    confirm.action(console, Request(key=f"{kind}:{node}:{gpu}", label=f"{kind.capitalize()} {what}", method="POST",
                                    path=f"/v1/nodes/{node}/actions", body=body, previewable=True))


def render(console: frame.Console, reader: Reader) -> None:
    nodes = reader.get("/v1/nodes")
    gpus = reader.get("/v1/gpus")
    for line in shaping.attention(nodes, [], gpus):
        st.warning(line)
    if not nodes:
        st.caption("No node has reported yet.")
        return
    for n in tiles.by_node(nodes, gpus):
        with st.container(border=True):
            status = " · :red-badge[not reporting]" if n["status"] == "stale" else ""
            cordon = " · :orange-badge[cordoned]" if n["cordoned"] else ""
            st.markdown(n["line"] + status + cordon)
            _cordon(console, n["node"], n["cordoned"])
            if not n["tiles"]:
                st.caption("No GPU reported on this node.")
            for start in range(0, len(n["tiles"]), TILES_PER_ROW):
                row = n["tiles"][start:start + TILES_PER_ROW]
                for column, tile in zip(st.columns(TILES_PER_ROW), row, strict=False):
                    with column.container(border=True):
                        st.markdown(f"**{tile['title']}**")
                        st.markdown(tile["badges"])
                        st.caption("  \n".join(tile["lines"]))
                        _cordon(console, n["node"], tile["cordoned"], tile["index"])
    st.subheader("Nodes")
    frame.table(shaping.node_rows(nodes), "No node has reported yet.")
    st.subheader("GPUs")
    frame.table(shaping.gpu_rows(gpus), "No GPUs reported.")


frame.page("Nodes & GPUs", render)
