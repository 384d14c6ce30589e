"""The Streamlit rendering of the Alerts section (data and HTTP are in ``alerts.py``)."""

from __future__ import annotations

import httpx
import pandas as pd
import streamlit as st

from controlplane.console import alerts
from controlplane.console.client import ApiUnavailable


def render(client: httpx.Client) -> None:
    """Alerts, firing first with what mutes them, and the deliveries of the one chosen."""
    st.subheader("Alerts")
    try:
        listed = alerts.fetch_alerts(client)
    except ApiUnavailable as exc:
        st.warning(f"Alerts unavailable: {exc}")
        return
    rows = alerts.alert_rows(listed)
    if not rows:
        st.caption("No alerts.")
        return
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    chosen = st.selectbox("deliveries of", [r["id"] for r in rows], key="alert_detail",
                          format_func=lambda i: next(f"#{r['id']} {r['alert']} {r['target']} ({r['state']})"
                                                     for r in rows if r["id"] == i))
    try:
        detail = alerts.fetch_alert(client, int(chosen))
    except ApiUnavailable as exc:
        st.warning(f"Deliveries unavailable: {exc}")
        return
    deliveries = alerts.delivery_rows(detail)
    if deliveries:
        st.dataframe(pd.DataFrame(deliveries), hide_index=True, width="stretch")
    else:
        st.caption("Not notified yet (or muted, or no receiver takes it).")
