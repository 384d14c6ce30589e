"""Actions reaching a final state, told to whoever counts them once the unit of work that wrote them commits.

``records`` notes each final state it writes on its session (``note``); ``watch(sessions, hook)`` calls
``hook(kind, state)`` for each of them after that session commits and drops them when it does not (a rollback, a
session closed without commit), so a counter never counts a move the database did not keep. The hook belongs to
one sessionmaker: two apps in one process count apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from controlplane.policy.lifecycle import FINAL, ActionState

log = logging.getLogger(__name__)

# Told of each action that reached a final state: its kind and that state.
FinishedHook = Callable[[str, ActionState], None]
_NOTED = "pitstop.finished_actions"


def note(session: Session, kind: str, state: ActionState) -> None:
    """Remember that ``session`` moved an action of ``kind`` to ``state`` (ignored unless ``state`` is final)."""
    if state in FINAL:
        session.info.setdefault(_NOTED, []).append((kind, state))


def watch(sessions: sessionmaker[Session], hook: FinishedHook) -> None:
    """Call ``hook`` for every final state noted in a session of ``sessions``, once that session commits."""

    def committed(session: Session) -> None:
        for kind, state in session.info.pop(_NOTED, ()):
            try:
                hook(kind, state)
            except Exception:  # the commit is done; a failing counter must not make it look failed
                log.exception("counting a finished %s action failed", kind)

    def ended(session: Session, transaction: SessionTransaction) -> None:
        # Runs after ``committed`` on a commit; otherwise the transaction was rolled back or abandoned.
        if transaction.parent is None:
            session.info.pop(_NOTED, None)

    event.listen(sessions, "after_commit", committed)
    event.listen(sessions, "after_transaction_end", ended)
