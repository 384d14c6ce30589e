"""Buttons that act on the fleet, safely: preview, confirm, then the control plane's answer (Streamlit).

A click never acts at once. It shows what the guardrails would decide and the blast radius (the API's dry run),
or, for a write with no dry run, what it does; only "Confirm" sends it, as the signed-in person. A
refusal shows the control plane's own reason. A viewer, or a visitor reading with the console's token, sees no
button at all.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from controlplane.console import previews, reads
from controlplane.console.client import Outcome, send
from controlplane.console.frame import Console
from controlplane.console.previews import Request

_PENDING = "pitstop_pending"
# The query that makes any action endpoint answer with its preview instead of acting.
DRY_RUN_QUERY = {"dry_run": "true"}
_DONE = "pitstop_done"


def _state(name: str) -> dict[str, Any]:
    got: dict[str, Any] = st.session_state.setdefault(name, {})
    return got


def _preview(console: Console, request: Request) -> Outcome:
    with console.client() as client:
        return send(client, request.method, request.path, json=request.body, params=DRY_RUN_QUERY)


def _send(console: Console, request: Request) -> Outcome:
    with console.client() as client:
        outcome = send(client, request.method, request.path, json=request.body)
    reads.forget()
    return outcome


def action(console: Console, request: Request, *, primary: bool = False) -> None:
    """The button, and once clicked the preview with Confirm / Cancel; nothing for who may not act."""
    if not console.identity.can_act:
        return
    pending, done = _state(_PENDING), _state(_DONE)
    if st.button(request.label, key=f"ask:{request.key}", type="primary" if primary else "secondary"):
        done.pop(request.key, None)
        pending[request.key] = _preview(console, request) if request.previewable else None
    if request.key in pending:
        _confirm(console, request, pending, done)
    if request.key in done:
        ok, line = done[request.key]
        (st.success if ok else st.error)(line)


def _confirm(console: Console, request: Request, pending: dict[str, Any], done: dict[str, Any]) -> None:
    preview: Outcome | None = pending[request.key]
    slot = st.empty()
    with slot.container(border=True):
        allowed = True
        if preview is None:
            st.markdown(f"**{request.label}?** {request.effect}")
        elif not preview.ok:
            allowed = False
            st.error(preview.message)
        else:
            body = preview.body or {}
            lines = previews.preview_lines(body)
            (st.info if previews.goes_ahead(body) else st.warning)(lines[0])
            st.code("\n".join(lines[1:]), language=None, wrap_lines=True)
        yes, no = st.columns(2)
        confirmed = allowed and yes.button(f"Confirm: {request.label.lower()}", key=f"yes:{request.key}",
                                           type="primary")
        cancelled = no.button("Cancel", key=f"no:{request.key}")
    if confirmed:
        pending.pop(request.key, None)
        outcome = _send(console, request)
        done[request.key] = (outcome.ok, previews.outcome_line(outcome))
        slot.empty()
    elif cancelled:
        pending.pop(request.key, None)
        slot.empty()
