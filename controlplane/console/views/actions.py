"""Actions & incidents: what was proposed, by which policy or person, on what evidence, what each guardrail
decided, who approved, how it ended; rollouts in flight with their progress; proposals waiting for a person."""

from __future__ import annotations

from datetime import UTC, datetime

import streamlit as st

from controlplane.console import actions, confirm, frame
from controlplane.console.previews import Request
from controlplane.console.reads import Reader
from controlplane.console.shaping import Json

OPEN = ("approved", "running")


def _waiting(console: frame.Console, proposed: list[Json]) -> None:
    st.markdown("**Waiting for approval**")
    for a in proposed:
        with st.container(border=True):
            st.write(f"#{a['id']} {a['kind']} {a['target']} ({a.get('policy') or 'operator'}): {a.get('reason', '')}")
            approve, reject = st.columns(2)
            with approve:
                confirm.action(console, Request(key=f"approve:{a['id']}", label="Approve", method="POST",
                                                path=f"/v1/actions/{a['id']}/approve",
                                                effect=f"Pitstop applies {a['kind']} on {a['target']} now, recorded "
                                                       "as approved by you."), primary=True)
            with reject:
                confirm.action(console, Request(key=f"reject:{a['id']}", label="Reject", method="POST",
                                                path=f"/v1/actions/{a['id']}/reject",
                                                effect="The proposal is closed and nothing is done."))


def _read_at(reader: Reader) -> datetime:
    """When the data shown was read (the "last updated" above the page): a rollout's time left is of it."""
    return reader.oldest or datetime.now(UTC)


def _rollouts(recent: list[Json], read_at: datetime) -> None:
    for a in recent:
        progress = actions.rollout_progress(a, read_at) if a["state"] in OPEN else None
        if progress is not None:
            st.markdown(f"**#{a['id']} {a['kind']} {a['target']}**")
            st.progress(progress.done / progress.total if progress.total else 0.0, text=progress.text)


def _detail(reader: Reader, action_id: int) -> None:
    a = reader.get(f"/v1/actions/{action_id}")
    st.markdown(f"**#{a['id']} {a['kind']} {a['target']}: {a['state']}** · {actions.who_line(a)}")
    if a.get("reason"):
        st.caption(a["reason"])
    if a.get("outcome"):
        st.markdown(f"Outcome: {a['outcome']}")
    progress = actions.rollout_progress(a, _read_at(reader))
    if progress is not None:
        st.progress(progress.done / progress.total if progress.total else 0.0, text=progress.text)
    st.markdown("**Guardrails**")
    frame.table(actions.guardrail_rows(a), "No guardrail decision recorded.")
    st.markdown("**Trail**")
    frame.table(actions.transition_rows(a), "No state change recorded yet.")
    lines = actions.evidence_lines(a)
    st.markdown("**Evidence**")
    st.code("\n".join(lines) if lines else "no evidence recorded (an operator's request)", language=None)
    captured = actions.captured_lines(a)
    if captured:
        st.markdown("**Captured before the restart** (stack dump, log tail)")
        st.code("\n".join(captured), language=None)


def render(console: frame.Console, reader: Reader) -> None:
    st.subheader("Actions")
    recent = reader.get("/v1/actions", limit=100)
    proposed = reader.get("/v1/actions", state="proposed", limit=100)
    breaker = reader.get("/v1/remediation/breaker")
    tripped, line = actions.breaker_line(breaker)
    (st.error if tripped else st.caption)(line)
    if tripped:
        confirm.action(console, Request(key="breaker-reset", label="Reset the circuit breaker", method="POST",
                                        path="/v1/remediation/breaker/reset",
                                        effect="Automation resumes and the breaker's page resolves."))
    if proposed:
        _waiting(console, proposed)
    _rollouts(recent, _read_at(reader))
    rows = actions.action_rows(recent)
    if not rows:
        st.caption("No actions yet: no policy has proposed anything.")
        return
    frame.table(rows, "")
    labels = {r["id"]: f"#{r['id']} {r['kind']} {r['target']} ({r['state']})" for r in rows}
    chosen = st.selectbox("why", list(labels), key="action_detail", format_func=labels.__getitem__)
    if chosen is not None:
        _detail(reader, int(chosen))


frame.page("Actions & incidents", render)
