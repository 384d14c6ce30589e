"""Policies: the policies loaded, each one's mode, and what it would do on the fleet now (a live dry run)."""

from __future__ import annotations

import streamlit as st

from controlplane.console import frame, policy_view
from controlplane.console.reads import Reader


def render(console: frame.Console, reader: Reader) -> None:
    listed = reader.get("/v1/policies")
    explained = reader.get("/v1/policies/explain")
    if not listed.get("enabled", True):
        st.warning("Policies are off on this control plane (policies_enabled: false): none of them acts.")
    note = policy_view.breaker_note(explained)
    if note:
        st.error(note)
    st.caption(f"Loaded from {', '.join(listed.get('sources') or []) or 'nowhere'} at {listed.get('loaded_at')}")
    frame.table(policy_view.policy_rows(listed.get("policies") or [], explained), "No policy is loaded.")
    errors = policy_view.error_rows(listed)
    if errors:
        st.error(f"{len(errors)} policy files did not load: the policies in them do not run.")
        frame.table(errors, "")


frame.page("Policies", render)
