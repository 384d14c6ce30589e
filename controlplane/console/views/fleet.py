"""Fleet: per model, is it meeting its SLOs, what is serving, what fires, and what Pitstop did about it.

One read of ``GET /v1/summary`` (plus the firing alerts, to name them per model).
"""

from __future__ import annotations

from urllib.parse import quote

import streamlit as st

from controlplane.console import charts, confirm, frame, overview
from controlplane.console.previews import Request
from controlplane.console.reads import Reader


def render(console: frame.Console, reader: Reader) -> None:
    summary = reader.get("/v1/summary")
    firing = reader.get("/v1/alerts", state="firing", limit=500)
    for level, line in overview.automation_lines(summary):
        getattr(st, level)(line)
    if (summary.get("automation") or {}).get("breaker", {}).get("tripped"):
        confirm.action(console, Request(
            key="breaker-reset", label="Reset the circuit breaker", method="POST",
            path="/v1/remediation/breaker/reset",
            effect="Automation resumes: the policies may restart and cordon again, and the breaker's page resolves."))
    st.caption(overview.node_line(summary))
    cards = overview.model_cards(summary, firing)
    if not cards:
        st.info("No replica has reported yet: models show here once an agent ('pitstop agent') reports.")
    for card in cards:
        model = next(m for m in summary["models"] if m["model"] == card["model"])
        with st.container(border=True):
            st.markdown(card["headline"] + f" · {card['throughput']}")
            st.markdown(card["objectives"])
            st.markdown(card["states"])
            st.altair_chart(charts.states(model.get("by_state") or {}), width="stretch")
            for line in card["alerts"]:
                st.warning(line)
            path = f"/v1/models/{quote(card['model'], safe='')}/actions"
            confirm.action(console, Request(
                key=f"rolling:{card['model']}", label=f"Rolling restart of {card['model']}", method="POST",
                path=path, body={"kind": "rolling_restart"}, previewable=True))
            if console.identity.can_act:
                # Tried on one replica first and judged beside its peers, as the governor's own changes are.
                # The engine's own flag: vLLM's --max-num-seqs, SGLang's --max-running-requests.
                flag = model.get("governed_flag") or "running limit"
                value = st.number_input(f"{flag}, canary first", min_value=1, max_value=65536, value=64,
                                        step=16, key=f"mns-value:{card['model']}")
                confirm.action(console, Request(
                    key=f"mns:{card['model']}", label=f"Set {flag} {int(value)} on {card['model']}",
                    method="POST", path=path, body={"kind": "set_max_num_seqs", "max_num_seqs": int(value)},
                    previewable=True))
    elsewhere = overview.firing_by_model(firing).get("", [])
    for a in elsewhere:
        st.warning(f"{a.get('severity')}: {(a.get('labels') or {}).get('alertname')} on "
                   f"{(a.get('labels') or {}).get('target')}")
    st.subheader("What Pitstop did last")
    frame.table(overview.recent_rows(summary), "No actions yet: no policy or person has asked for anything.")


frame.page("Fleet", render)
