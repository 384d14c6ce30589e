"""Alerts: firing, muted and resolved, with where each was delivered; silences made and expired from here."""

from __future__ import annotations

import streamlit as st

from controlplane.console import alerts, confirm, frame, reads
from controlplane.console.client import send
from controlplane.console.previews import Request
from controlplane.console.reads import Reader
from controlplane.console.shaping import Json


def _silence_form(console: frame.Console, alert: Json | None) -> None:
    prefill = "\n".join(alerts.matchers_for(alert)) if alert else ""
    suffix = alert["id"] if alert else "new"
    with st.form(f"silence-{suffix}"):
        st.markdown("**Silence**" + (f" alert #{alert['id']} and its re-fires" if alert else ""))
        matchers = st.text_area("matchers, one per line", value=prefill, key=f"silence_matchers_{suffix}")
        duration = st.text_input("for", value="2h", key=f"silence_duration_{suffix}")
        comment = st.text_input("why (on-call reads this while the alert stays quiet)",
                                key=f"silence_comment_{suffix}")
        submitted = st.form_submit_button("Create silence")
    if submitted:
        body = {"matchers": alerts.parse_matcher_lines(matchers), "duration": duration.strip(), "comment": comment}
        with console.client() as client:
            outcome = send(client, "POST", "/v1/silences", json=body)
        reads.forget()
        if outcome.ok:
            st.success(f"silence #{outcome.body['id']} until {outcome.body['ends_at']}")
        else:
            st.error(outcome.message)


def _silences(console: frame.Console, reader: Reader) -> None:
    st.subheader("Silences")
    listed = reader.get("/v1/silences")
    frame.table(alerts.silence_rows(listed), "No silence active or recent.")
    for s in listed:
        if s.get("state") in ("active", "pending"):
            confirm.action(console, Request(key=f"expire:{s['id']}", label=f"Expire silence #{s['id']}",
                                            method="DELETE", path=f"/v1/silences/{s['id']}",
                                            effect=f"Alerts matching {', '.join(s['matchers'])} notify again."))


def render(console: frame.Console, reader: Reader) -> None:
    st.subheader("Alerts")
    listed = reader.get("/v1/alerts", limit=200)
    rows = alerts.alert_rows(listed)
    chosen: Json | None = None
    if not rows:
        st.caption("No alerts.")
    else:
        frame.table(rows, "")
        labels = {r["id"]: f"#{r['id']} {r['alert']} {r['target']} ({r['state']})" for r in rows}
        picked = st.selectbox("deliveries of", list(labels), key="alert_detail", format_func=labels.__getitem__)
        detail = reader.get(f"/v1/alerts/{int(picked)}") if picked is not None else None
        if detail is not None:
            chosen = detail
            frame.table(alerts.delivery_rows(detail), "Not notified yet (or muted, or no receiver takes it).")
    if console.identity.can_act:
        _silence_form(console, chosen)
    _silences(console, reader)


frame.page("Alerts", render)
