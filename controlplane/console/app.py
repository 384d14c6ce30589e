"""The Pitstop console: one Streamlit page with the fleet, read from the control-plane API (never the DB).

Run it with ``pitstop console``; the API URL and token arrive as environment variables.
"""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import streamlit as st

from controlplane.console import actions_view, alerts_view, shaping
from controlplane.console.client import ApiUnavailable, ConsoleSettings, fetch_fleet, fetch_samples

CHART_FIELDS = ("ttft_p99_seconds", "itl_p99_seconds", "rss_bytes")


def _table(rows: list[dict[str, object]], empty: str) -> None:
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    else:
        st.caption(empty)


def _detail(replica: dict[str, object]) -> None:
    facts = shaping.replica_detail(replica)
    log_tail = facts.pop("log tail")
    st.dataframe(pd.DataFrame([facts]), hide_index=True, width="stretch")
    if log_tail:
        with st.expander("log tail"):
            st.code(log_tail, language=None)


def _fleet(settings: ConsoleSettings) -> None:
    with settings.client() as client:
        try:
            fleet = fetch_fleet(client)
        except ApiUnavailable as exc:
            st.error(f"Control plane unavailable: {exc}")
            return
        summary = shaping.fleet_summary(fleet.nodes, fleet.replicas)
        for column, (label, value) in zip(st.columns(len(summary)), summary.items(), strict=True):
            column.metric(label, value)
        for line in shaping.attention(fleet.nodes, fleet.replicas, fleet.gpus):
            st.warning(line)

        st.subheader("Nodes")
        _table(shaping.node_rows(fleet.nodes), "No node has reported yet.")
        st.subheader("Replicas")
        _table(shaping.replica_rows(fleet.replicas), "No replicas reported.")
        st.subheader("GPUs")
        _table(shaping.gpu_rows(fleet.gpus), "No GPUs reported.")
        st.subheader("Recent events")
        _table(shaping.event_rows(fleet.events), "No events yet.")
        alerts_view.render(client)
        actions_view.render(client)

        if fleet.replicas:
            st.subheader("Replica history")
            keys = [f"{r['node']}/{r['name']}" for r in fleet.replicas]
            chosen = st.selectbox("replica", keys, key="chart_replica")
            node, _, name = (chosen or keys[0]).partition("/")
            _detail(next(r for r in fleet.replicas if r["node"] == node and r["name"] == name))
            try:
                samples = fetch_samples(client, node=node, replica=name)
            except ApiUnavailable as exc:
                st.warning(f"History unavailable: {exc}")
                return
            series = shaping.sample_series(samples, CHART_FIELDS)
            if len(series["at"]) < 2:
                st.caption("Not enough samples for a chart yet.")
                return
            frame = pd.DataFrame(series).set_index("at")
            left, right = st.columns(2)
            left.caption("TTFT / ITL p99 (ms)")
            left.line_chart(frame[["ttft_p99 ms", "itl_p99 ms"]])
            right.caption("RSS of the process tree (MiB)")
            right.line_chart(frame[["rss MiB"]])


def main() -> None:
    st.set_page_config(page_title="Pitstop", layout="wide")
    settings = ConsoleSettings.from_env()
    st.title("Pitstop fleet")
    st.caption(f"Control plane: {settings.api_url} · refreshes every {settings.refresh_seconds:g}s")
    # A fragment re-runs on its own timer, so the page refreshes without reloading the browser tab.
    st.fragment(run_every=timedelta(seconds=settings.refresh_seconds))(_fleet)(settings)


main()
