"""The Streamlit rendering of the Actions section (data and HTTP are in ``actions.py``)."""

from __future__ import annotations

import httpx
import pandas as pd
import streamlit as st

from controlplane.console import actions
from controlplane.console.client import ApiUnavailable


def render(client: httpx.Client) -> None:
    """Breaker banner, proposals with approve/reject buttons, then recent actions with their evidence."""
    st.subheader("Actions")
    try:
        view = actions.fetch_actions(client)
    except ApiUnavailable as exc:
        st.warning(f"Actions unavailable: {exc}")
        return
    tripped, line = actions.breaker_line(view.breaker)
    (st.error if tripped else st.caption)(line)
    if view.proposed:
        st.markdown("**Waiting for approval**")
    for a in view.proposed:
        left, approve, reject = st.columns([6, 1, 1])
        left.write(f"#{a['id']} {a['kind']} {a['target']} ({a.get('policy') or 'operator'}): {a.get('reason', '')}")
        for flag, column, label in ((True, approve, "Approve"), (False, reject, "Reject")):
            if column.button(label, key=f"{label.lower()}-{a['id']}"):
                try:
                    st.info(actions.decide(client, int(a["id"]), approve=flag))
                except ApiUnavailable as exc:
                    st.error(str(exc))
    rows = actions.action_rows(view.actions)
    if not rows:
        st.caption("No actions yet: no policy has proposed anything.")
        return
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    chosen = st.selectbox("why", [r["id"] for r in rows], key="action_detail",
                          format_func=lambda i: next(f"#{r['id']} {r['kind']} {r['target']} ({r['state']})"
                                                     for r in rows if r["id"] == i))
    action = next((a for a in view.actions if a["id"] == chosen), None)
    if action is not None:
        lines = actions.evidence_lines(action)
        st.code("\n".join(lines) if lines else "no evidence recorded (an operator's request)", language=None)
        captured = actions.captured_lines(action)
        if captured:
            st.markdown("**Captured before the restart** (stack dump, log tail)")
            st.code("\n".join(captured), language=None)
